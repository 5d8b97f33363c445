"""Injected sandboxes through the whole stack: ``orchard up`` (real gateway, scheduler,
node executor and runc), the SDK, and the executor address the create answer carries.

The scheduler runs with ``ORCHARD_EXECUTOR_BUNDLE`` set, so sandboxes of runtime
class "" run their own executor from the bundle and the scheduler hands clients
``unix:<home>/sandboxes/<id>/run/executor.sock``; a template with runtime class
``runc`` in the same stack is served by the node executor instead.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from orchard import Orchard, Sandbox
from tests.port_serving import check_http_through_forward
from tests.stack import REQUIRES_STACK, Stack, running_stack

pytestmark = REQUIRES_STACK

TEMPLATES = """
[templates.node]
runtime_class = "runc"
memory_bytes = 268435456
min = 0
max = 2

[templates.own]
runtime_class = "injected"
memory_bytes = 268435456
min = 1
max = 2
"""


@pytest.fixture(scope="module")
def stack(bundle: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    home = tmp_path_factory.mktemp("inj-stack")
    (home / "templates.toml").write_text(TEMPLATES)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("ORCHARD_EXECUTOR_BUNDLE", str(bundle))
        with running_stack(home) as running:
            yield running


def address_of(sb: Sandbox) -> str:
    _stub, access = sb._executor()
    return access.address


def node_executor(stack: Stack) -> str:
    return (stack.home / "run" / "executor.addr").read_text().strip()


def test_an_injected_sandbox_is_used_through_its_own_executor(stack: Stack, tmp_path: Path) -> None:
    key = (stack.home / "dev-api-key").read_text().strip()
    with Orchard(stack.endpoint, key).sandboxes.create(memory="256Mi", ttl=300) as sb:
        own = f"unix:{stack.home.resolve()}/sandboxes/{sb.id}/run/executor.sock"
        assert address_of(sb) == own
        assert own != node_executor(stack)
        # The executor inside runs from the read-only bundle mount.
        listing = sb.exec(["/bin/sh", "-c", "ls /.orchard; touch /.orchard/bundle/x"])
        assert b"bundle" in listing.stdout and listing.exit_code != 0
        r = sb.exec("echo out; echo err >&2; exit 3", timeout=10)
        assert (r.exit_code, r.stdout, r.stderr_text) == (3, b"out\n", "err\n")
        assert sb.write_file("/tmp/f.bin", b"\1" * 4096) == 4096
        assert sb.read_file("/tmp/f.bin") == b"\1" * 4096
        with sb.session() as sh:
            sh.run("cd /tmp && export Y=9")
            assert sh.run("pwd; echo $Y").stdout_text == "/tmp\n9\n"
        (tmp_path / "up").mkdir()
        (tmp_path / "up" / "a.txt").write_text("hello")
        sb.upload(tmp_path / "up", "/srv")
        sb.download("/srv", tmp_path / "down")
        assert (tmp_path / "down" / "a.txt").read_text() == "hello"
        # A fresh connection (GetExecutorAccess) gets the same address.
        again = Orchard(stack.endpoint, key).sandboxes.connect(sb.id)
        assert again.exec(["cat", "/tmp/f.bin"]).stdout == b"\1" * 4096
        assert address_of(again) == own


def test_runtime_class_per_template_picks_the_executor(stack: Stack) -> None:
    key = (stack.home / "dev-api-key").read_text().strip()
    with Orchard(stack.endpoint, key).sandboxes.create(template="own") as own:
        assert address_of(own).endswith(f"/sandboxes/{own.id}/run/executor.sock")
        assert own.exec(["true"]).exit_code == 0
    with Orchard(stack.endpoint, key).sandboxes.create(template="node") as node:
        assert address_of(node) == node_executor(stack)
        # No bundle in a node-executor sandbox (only orchard-init at /.orchard/init).
        assert node.exec(["/bin/sh", "-c", "test -e /.orchard/bundle"]).exit_code != 0
        assert node.exec(["echo", "hi"]).stdout == b"hi\n"


def test_ports_reach_an_injected_sandbox(stack: Stack) -> None:
    """Port forwarding where the executor lives in the sandbox (its own namespace is the
    sandbox's: port_dial.LocalDialer), many connections at once."""

    key = (stack.home / "dev-api-key").read_text().strip()
    with Orchard(stack.endpoint, key).sandboxes.create(memory="256Mi", ttl=300) as sb:
        assert address_of(sb) != node_executor(stack)
        sb.write_file("/srv/i.txt", "injected\n")
        check_http_through_forward(sb, "i.txt", b"injected\n", fetches=32, threads=8)
