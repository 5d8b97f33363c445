"""``orchard up`` on the old-kernel writable layer (forced), real processes and runc.

``ORCHARD_SCRATCH_MOUNT=mounted`` makes the local backend take the path kernels
before 6.13 get by themselves (``scratch.py``); this machine's kernel may be
newer, so it is forced. ``orchard up`` must say so, and create -> exec -> write
-> read -> delete through the CLI must work and leave nothing behind.
"""

from __future__ import annotations

import os
import select
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.stack import REQUIRES_STACK, Stack, running_stack

pytestmark = REQUIRES_STACK


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[Stack]:
    # User namespaces need the detached layer: the fallback runs without them, said so.
    env = {"ORCHARD_SCRATCH_MOUNT": "mounted", "ORCHARD_USERNS": "0"}
    with running_stack(tmp_path / "home", env) as running:
        yield running


def _printed_line(stack: Stack, prefix: str, timeout: float = 10.0) -> str:
    """The first line ``orchard up`` printed that starts with ``prefix``."""
    assert stack.process.stdout is not None
    text = stack.output
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for line in text.splitlines():
            if line.startswith(prefix):
                return line
        ready, _, _ = select.select([stack.process.stdout], [], [], 0.5)
        if ready:
            text += os.read(stack.process.stdout.fileno(), 4096).decode()
    raise AssertionError(f"orchard up printed no {prefix!r} line: {text}")


def test_up_says_it_fell_back_and_sandboxes_work_and_go(stack: Stack, tmp_path: Path) -> None:
    line = _printed_line(stack, "Sandbox writable layer: ")
    assert "FALLBACK" in line and "cap enforced" in line and "ORCHARD_SCRATCH_MOUNT" in line
    scheduler_log = (stack.home / "logs" / "scheduler.log").read_text()
    assert scheduler_log.count("sandbox writable layer: fallback") == 1, scheduler_log

    sandbox_id = stack.cli("create", check=True).stdout.strip()
    assert (stack.home / "sandboxes" / sandbox_id / "scratch").is_dir()
    hello = tmp_path / "hello.txt"
    hello.write_text("hello\n")
    stack.cli("cp", str(hello), f"{sandbox_id}:/work/hello.txt", check=True)
    run = stack.cli(
        "exec", sandbox_id, "--", "sh", "-c", "cat /work/hello.txt; echo more >> /work/hello.txt"
    )
    assert (run.returncode, run.stdout) == (0, "hello\n")
    back = tmp_path / "back"
    back.mkdir()
    stack.cli("cp", f"{sandbox_id}:/work/hello.txt", str(back), check=True)
    assert (back / "hello.txt").read_text() == "hello\nmore\n"

    assert stack.cli("rm", sandbox_id, check=True).stdout.strip() == sandbox_id
    # rm answers once the sandbox is DELETING; the teardown finishes in the background.
    deadline = time.monotonic() + 30
    while (stack.home / "sandboxes" / sandbox_id).exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not (stack.home / "sandboxes" / sandbox_id).exists()
    stack.process.send_signal(signal.SIGTERM)
    assert stack.process.wait(90) == 0
    with open("/proc/self/mountinfo") as mounts:
        assert str(stack.home) not in mounts.read()
    assert list((stack.home / "sandboxes").iterdir()) == []
