"""A crash of the whole stack (kill -9 of orchard up and every service) loses nothing and leaks nothing.

The sandboxes outlive the crash (they are runc containers); a new ``orchard up``
in the same home must account for every one of them: ready sandboxes are
adopted and keep working through the new executor, and a graceful stop then
leaves no process, mount, cgroup, runc state or folder behind.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

from orchard import Orchard
from tests.cgroup_paths import sandbox_cgroup_dirs
from tests.stack import REQUIRES_STACK, running_stack

pytestmark = REQUIRES_STACK


def _descendants(pid: int) -> list[int]:
    found: list[int] = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        for child in (task / "children").read_text().split():
            found.append(int(child))
            found.extend(_descendants(int(child)))
    return found


def _runc_ids(home: Path) -> set[str]:
    listed = subprocess.run(
        ["runc", "--root", str(home / "run" / "runc"), "list", "-q"],
        capture_output=True,
        text=True,
        check=True,
    )
    return set(listed.stdout.split())


def test_kill_9_of_the_stack_then_restart_accounts_for_every_sandbox(tmp_path: Path) -> None:
    home = tmp_path / "home"
    with running_stack(home) as stack:
        key = (home / "dev-api-key").read_text().strip()
        boxes = [Orchard(stack.endpoint, key).sandboxes.create() for _ in range(3)]
        boxes[0].write_file("/work/kept.txt", b"acknowledged before the crash")
        ids = {b.id for b in boxes}
        services = _descendants(stack.process.pid)
        assert services, "orchard up has no service processes"
        # The crash: every process of the stack dies at once, nothing is cleaned up.
        for pid in [stack.process.pid, *services]:
            os.kill(pid, signal.SIGKILL)
        stack.process.wait(10)
        for pid in services:
            deadline = time.monotonic() + 10
            while Path(f"/proc/{pid}").exists() and time.monotonic() < deadline:
                time.sleep(0.05)
        assert ids <= _runc_ids(home), "the sandboxes should outlive the crash"

    with running_stack(home) as stack:
        key = (home / "dev-api-key").read_text().strip()
        listed = {s.id for s in Orchard(stack.endpoint, key).sandboxes.list()}
        assert ids <= listed, (ids, listed)
        adopted = Orchard(stack.endpoint, key).sandboxes.connect(boxes[0].id)
        assert adopted.read_file("/work/kept.txt") == b"acknowledged before the crash"
        assert adopted.exec(["echo", "alive"]).stdout == b"alive\n"
        stack.process.send_signal(signal.SIGTERM)
        assert stack.process.wait(90) == 0

    assert _runc_ids(home) == set()
    assert list((home / "sandboxes").iterdir()) == []
    with open("/proc/self/mountinfo") as mounts:
        assert str(home) not in mounts.read()
    for sandbox_id in ids:
        assert sandbox_cgroup_dirs(sandbox_id) == []
    leftover = subprocess.run(["pgrep", "-f", f"--home {home}"], capture_output=True, text=True)
    assert leftover.stdout.strip() == ""
