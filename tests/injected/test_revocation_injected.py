"""A revoked tenant's tokens stop working in sandboxes that run their own executor
(issue 12): local *injected* (runc) and runsc sandboxes, on a real ``orchard up``.

Before: the node executor and the gateway re-read ``revocations.json``, but an
injected executor checks tokens itself with its own keys and had no such file,
so after ``tenant revoke`` / ``rotate-key`` a token the SDK already held kept
running commands in the sandbox (its address is the sandbox's unix socket: the
SDK talks to it directly) until it expired, up to an hour later. Now the
scheduler pushes each live sandbox of the tenant a notice signed with that
sandbox's own key (``scheduler/revocations.py``).

Also here: a sandbox whose executor cannot take the notice (stopped with
SIGSTOP) is not left serving the old tokens: after the give-up bound the
scheduler deletes it; and the other tenants' sandboxes are not touched.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import orchard
from orchard import Orchard, Sandbox
from tests.stack import REQUIRES_STACK, Stack, running_stack

from .runsc_footprint import force_delete_runsc
from .sandbox_pids import SandboxPids

pytestmark = [*REQUIRES_STACK, pytest.mark.reliability]

# The scheduler looks at revocations.json every 0.5 s and pushes at once; "within seconds".
REVOKED_WITHIN_SECONDS = 5.0
GIVE_UP_SECONDS = 4.0
HAS_RUNSC = shutil.which("runsc") is not None

TEMPLATES = """
[templates.own]
runtime_class = "injected"
memory_bytes = 268435456
min = 0
max = 4

[templates.gvisor]
runtime_class = "runsc"
memory_bytes = 536870912
pids = 2048
min = 0
max = 2
"""
RUNTIMES = [
    "own",
    pytest.param(
        "gvisor",
        marks=pytest.mark.skipif(not HAS_RUNSC, reason="needs gVisor's runsc (Debian runsc)"),
    ),
]


@pytest.fixture(scope="module")
def stack(bundle: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    home = tmp_path_factory.mktemp("inj-revocation")
    (home / "templates.toml").write_text(TEMPLATES)
    extra = {
        "ORCHARD_EXECUTOR_BUNDLE": str(bundle),
        "ORCHARD_REVOCATION_GIVE_UP_SECONDS": str(GIVE_UP_SECONDS),
    }
    try:
        with running_stack(home, extra_env=extra) as running:
            yield running
    finally:
        if HAS_RUNSC:
            force_delete_runsc(home)


def tenant(stack: Stack, *args: str) -> str:
    return stack.cli("tenant", "--home", str(stack.home), *args, check=True).stdout.strip()


def own_address(stack: Stack, sb: Sandbox) -> str:
    _stub, access = sb._executor()
    address: str = access.address
    assert address == f"unix:{stack.home.resolve()}/sandboxes/{sb.id}/run/executor.sock"
    return address


def until(refused: Callable[[], Any], within: float) -> float:
    """Seconds until ``refused()`` raises AuthenticationError (fails past ``within``)."""
    started = time.monotonic()
    while time.monotonic() - started < within:
        try:
            refused()
        except orchard.AuthenticationError:
            return time.monotonic() - started
        time.sleep(0.1)
    raise AssertionError(f"the old token still ran commands {within} s after the revocation")


@pytest.mark.parametrize("template", RUNTIMES)
@pytest.mark.parametrize("how", ["revoke", "rotate-key"])
def test_a_revoked_tenants_old_token_stops_in_its_own_executor(
    stack: Stack, template: str, how: str
) -> None:
    name = f"inj-{how}-{template}"
    key = tenant(stack, "create", name)
    sb = Orchard(stack.endpoint, key).sandboxes.create(template=template, ttl=600)
    new_key = ""
    try:
        own_address(stack, sb)  # the SDK holds a token for the sandbox's own executor
        assert sb.exec("echo before").stdout == b"before\n"
        time.sleep(0.01)  # the revocation comes strictly after the token was issued
        new_key = tenant(stack, how, name)
        took = until(lambda: sb.exec("true"), REVOKED_WITHIN_SECONDS)
        print(f"{template} {how}: old token refused after {took:.2f} s")
        if how == "rotate-key":
            # The new key's fresh tokens work in the same sandbox.
            again = Orchard(stack.endpoint, new_key).sandboxes.connect(sb.id)
            assert again.exec("echo new").stdout == b"new\n"
    finally:
        if how == "rotate-key" and new_key:
            Orchard(stack.endpoint, new_key).sandboxes.delete(sb.id)


def test_other_tenants_injected_sandboxes_keep_working(stack: Stack) -> None:
    keep = tenant(stack, "create", "inj-bystander")
    tenant(stack, "create", "inj-victim")
    with Orchard(stack.endpoint, keep).sandboxes.create(template="own", ttl=600) as sb:
        assert sb.exec("true").exit_code == 0
        tenant(stack, "revoke", "inj-victim")
        time.sleep(2.0)
        assert sb.exec("echo fine").stdout == b"fine\n"


def _executor_pid(stack: Stack, sandbox_id: str) -> int:
    init_pid = int((stack.home / "sandboxes" / sandbox_id / "init.pid").read_text())
    [(host_pid, _)] = SandboxPids(init_pid).find(b"orchard.executor\0--in-sandbox")
    return host_pid


def test_a_sandbox_that_cannot_be_told_is_deleted(stack: Stack) -> None:
    """The executor is stopped (SIGSTOP): it takes no notice, and with it stopped nobody can
    use the sandbox. Once it has failed to take one for the give-up bound, the scheduler
    deletes the sandbox rather than leave it to serve the revoked tokens when it resumes."""
    name = "inj-unreachable"
    key = tenant(stack, "create", name)
    sb = Orchard(stack.endpoint, key).sandboxes.create(template="own", ttl=600)
    pid = _executor_pid(stack, sb.id)
    folder = stack.home / "sandboxes" / sb.id
    os.kill(pid, signal.SIGSTOP)
    try:
        tenant(stack, "revoke", name)
        deadline = time.monotonic() + GIVE_UP_SECONDS + 20
        while folder.exists() and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not folder.exists(), "the sandbox that took no notice is still there"
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGCONT)
