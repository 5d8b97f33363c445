"""A call that fails because its sandbox is being deleted says SANDBOX_NOT_FOUND.

Found in the integration suite: an ``exec(user="nobody")`` racing a delete failed with
``user 'nobody' does not exist`` (the overlay with /etc/passwd was already unmounted).
The unit tests walk each step of the backend's teardown on a real tmpfs mount; the live
test races real deletes against real calls.
"""

from __future__ import annotations

import os
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from orchard.executor import gone, sandboxes

import orchard
from orchard.common.errors import ServiceError, not_found, precondition
from orchard.common.layout import NodeLayout, SandboxMeta
from tests.stack import Stack

from ..e2e.test_cli import stack  # noqa: F401  (the fixture)

SANDBOX_ID = "sb-00000000beef"


@pytest.fixture
def mounted(tmp_path: Path) -> Iterator[tuple[sandboxes.SandboxDirectory, sandboxes.Sandbox]]:
    """A sandbox folder as the backend lays it out, its root a real (tmpfs) mount."""
    layout = NodeLayout(tmp_path)
    sb = layout.sandbox(SANDBOX_ID)
    sb.rootfs.mkdir(parents=True)
    subprocess.run(["mount", "-t", "tmpfs", "none", str(sb.rootfs)], check=True)
    SandboxMeta(SANDBOX_ID, init_pid=os.getpid()).write(sb.meta_file)
    sb.init_socket.touch()
    directory = sandboxes.SandboxDirectory(layout)
    try:
        yield directory, directory.get(SANDBOX_ID)
    finally:
        subprocess.run(["umount", "-l", str(sb.rootfs)], check=False)


def _user_missing() -> ServiceError:
    return not_found("user 'nobody' does not exist in the sandbox", "USER_NOT_FOUND")


def _refine_in_call(sandbox: sandboxes.Sandbox, locator: sandboxes.SandboxLocator) -> Exception:
    """What the servicer's wrapper does: the call remembered its sandbox, then failed."""
    gone.remember(sandbox)
    return gone.refined(_user_missing(), locator)


def test_a_live_sandbox_keeps_its_own_error(mounted: tuple) -> None:  # type: ignore[type-arg]
    directory, sandbox = mounted
    err = _refine_in_call(sandbox, directory)
    assert isinstance(err, ServiceError) and err.reason == "USER_NOT_FOUND"


def test_the_delete_marker_reads_as_not_found(mounted: tuple, tmp_path: Path) -> None:  # type: ignore[type-arg]
    directory, sandbox = mounted
    NodeLayout(tmp_path).sandbox(SANDBOX_ID).deleting_marker.touch()
    subprocess.run(["umount", str(sandbox.rootfs)], check=True)  # the next step of the delete
    err = _refine_in_call(sandbox, directory)
    assert isinstance(err, ServiceError) and err.reason == "SANDBOX_NOT_FOUND"
    assert err.code == grpc.StatusCode.NOT_FOUND and "deleted during the call" in err.message
    assert isinstance(err.__cause__, ServiceError)  # the original stays in the log's chain


def test_a_dead_init_alone_is_a_broken_sandbox_not_a_gone_one(
    mounted: tuple,  # type: ignore[type-arg]
    tmp_path: Path,
) -> None:
    directory, _ = mounted
    child = subprocess.Popen(["true"])
    child.wait()
    meta_file = NodeLayout(tmp_path).sandbox(SANDBOX_ID).meta_file
    SandboxMeta(SANDBOX_ID, init_pid=child.pid).write(meta_file)
    err = _refine_in_call(directory.get(SANDBOX_ID), directory)
    assert isinstance(err, ServiceError) and err.reason == "USER_NOT_FOUND"


def test_a_removed_meta_file_reads_as_not_found(mounted: tuple, tmp_path: Path) -> None:  # type: ignore[type-arg]
    directory, sandbox = mounted
    NodeLayout(tmp_path).sandbox(SANDBOX_ID).meta_file.unlink()
    err = _refine_in_call(sandbox, directory)
    assert isinstance(err, ServiceError) and err.reason == "SANDBOX_NOT_FOUND"


def test_a_call_that_named_no_sandbox_is_left_alone(mounted: tuple) -> None:  # type: ignore[type-arg]
    directory, _ = mounted
    original = precondition("bad", "X")

    def in_fresh_context() -> Exception:
        return gone.refined(original, directory)

    import contextvars

    assert contextvars.Context().run(in_fresh_context) is original


@pytest.mark.runc
def test_calls_racing_a_delete_fail_only_as_not_found(stack: Stack) -> None:  # noqa: F811
    key = (stack.home / "dev-api-key").read_text().strip()
    client = orchard.Orchard(stack.endpoint, key)
    unexpected: list[BaseException] = []
    for _ in range(6):
        sb = client.sandboxes.create(cpu=0.25, memory="256Mi", ttl=300)
        stop = threading.Event()

        def hammer(call: str, box: orchard.Sandbox = sb, stop: threading.Event = stop) -> None:
            while not stop.is_set():
                try:
                    if call == "exec":
                        box.exec("true", user="nobody", timeout=10)
                    else:
                        box.read_file("/etc/passwd")
                except orchard.SandboxNotFoundError:
                    return
                except BaseException as exc:  # collected and asserted below
                    unexpected.append(exc)
                    return

        threads = [threading.Thread(target=hammer, args=(c,)) for c in ("exec", "read", "exec")]
        for t in threads:
            t.start()
        sb.delete()
        for t in threads:
            t.join(timeout=60)
        stop.set()  # a thread still calling after 60 s is reported below by its absence
        assert not any(t.is_alive() for t in threads), "calls went on after the delete"
    client.close()
    assert not unexpected, [f"{type(e).__name__}: {e}" for e in unexpected]
