"""Inspect AI's own provider conformance suite (``inspect_ai.util._sandbox.self_check``)
against ``sandbox="orchard"`` on a real stack.

Every check runs; the ones a root sandbox cannot pass are expected failures,
each with its reason (Inspect's own runner marks the same two for its
docker-root configuration, tests/tools/test_sandbox_docker_and_local.py).
The sandbox is made the way an eval makes it: the provider is looked up by
name in Inspect's registry (our entry point), then task_init / sample_init,
and sample_cleanup / task_cleanup at the end.
"""

from __future__ import annotations

import asyncio
import shlex
import subprocess
import sys
from collections.abc import Iterator

import inspect_ai.util._sandbox.self_check as self_check
import pytest
from inspect_ai.util import SandboxEnvironment
from inspect_ai.util._sandbox.registry import registry_find_sandboxenv

from orchard import Orchard
from orchard.integrations.inspect import OrchardSandboxEnvironment
from tests.stack import REQUIRES_STACK, Stack

pytestmark = REQUIRES_STACK

ROOT_WRITES_READ_ONLY = "root can overwrite a read-only file (as in Inspect's docker-root runner)"
EXPECTED_FAILURES = {
    "test_write_text_file_without_permissions": ROOT_WRITES_READ_ONLY,
    "test_write_binary_file_without_permissions": ROOT_WRITES_READ_ONLY,
}


# Today's SDK refuses a command whose argv is over 1 MiB ("argv/shell is 1048584
# bytes; the limit is 1048576", the executor's exec limit); the check sends 16 x 64 KiB.
# The SDK limits are being raised on another branch: the lead flips this at merge.
def _params() -> list[object]:
    params: list[object] = []
    for name in self_check.__all__:
        marks: list[pytest.MarkDecorator] = []
        if name in EXPECTED_FAILURES:
            marks.append(pytest.mark.xfail(reason=EXPECTED_FAILURES[name], strict=True))
        params.append(pytest.param(name, marks=marks, id=name.removeprefix("test_")))
    return params


@pytest.fixture(scope="module")
def runner() -> Iterator[asyncio.Runner]:
    """One event loop for the module: the env's client channels live on it."""
    with asyncio.Runner() as r:
        yield r


@pytest.fixture(scope="module")
def sandbox_env(stack: Stack, runner: asyncio.Runner) -> Iterator[SandboxEnvironment]:
    provider = registry_find_sandboxenv("orchard")
    assert provider is OrchardSandboxEnvironment
    task = "self_check"
    runner.run(provider.task_init(task, None))
    envs = runner.run(provider.sample_init(task, None, {"__sample_id__": "1"}))
    try:
        yield envs["default"]
    finally:
        runner.run(provider.sample_cleanup(task, None, envs, False))
        runner.run(provider.task_cleanup(task, None, True))
    with Orchard() as client:
        sandbox_id = envs["default"].as_type(OrchardSandboxEnvironment).sandbox.id
        assert client.sandboxes.connect(sandbox_id).last_info.state in ("deleting", "deleted")


@pytest.mark.timeout(60)
@pytest.mark.parametrize("check", _params())
def test_inspect_self_check(
    check: str, sandbox_env: SandboxEnvironment, runner: asyncio.Runner
) -> None:
    runner.run(getattr(self_check, check)(sandbox_env))


def test_connection_command_reaches_the_sandbox(
    sandbox_env: SandboxEnvironment, runner: asyncio.Runner
) -> None:
    """What ``inspect sandbox connect`` prints works: the CLI command opens a shell there."""
    connection = runner.run(sandbox_env.connection())
    assert connection.type == "orchard"
    argv = shlex.split(connection.command)
    assert argv[0] == "orchard"
    shell = subprocess.run(
        [sys.executable, "-m", "orchard.cli", *argv[1:]],
        input="hostname; exit 3\n", capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    sandbox_id = sandbox_env.as_type(OrchardSandboxEnvironment).sandbox.id
    assert (shell.returncode, shell.stdout.strip()) == (3, sandbox_id)
