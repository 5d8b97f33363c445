"""Pids printed inside a sandbox, seen from the host.

The executor tests check that processes are really gone by their pids; a
command in a container prints pids of the sandbox's pid namespace. These
helpers find the host process behind such a pid (same pid namespace as the
sandbox's init, last NSpid field equal), so the same checks hold.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time


class SandboxPids:
    def __init__(self, init_pid: int) -> None:
        self.pid_ns = os.readlink(f"/proc/{init_pid}/ns/pid")

    def host_pid(self, ns_pid: int) -> int | None:
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            with contextlib.suppress(OSError):
                if os.readlink(f"/proc/{entry}/ns/pid") != self.pid_ns:
                    continue
                with open(f"/proc/{entry}/status") as f:
                    for line in f:
                        if line.startswith("NSpid:"):
                            if int(line.split()[-1]) == ns_pid:
                                return int(entry)
                            break
        return None

    def find(self, cmdline_part: bytes) -> list[tuple[int, int]]:
        """(host pid, sandbox pid) of the sandbox's processes whose cmdline holds ``cmdline_part``."""
        found = []
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            with contextlib.suppress(OSError):
                if os.readlink(f"/proc/{entry}/ns/pid") != self.pid_ns:
                    continue
                with open(f"/proc/{entry}/cmdline", "rb") as f:
                    if cmdline_part not in f.read():
                        continue
                with open(f"/proc/{entry}/status") as f:
                    ns_pid = next(int(line.split()[-1]) for line in f if line.startswith("NSpid:"))
                found.append((int(entry), ns_pid))
        return found

    def alive(self, ns_pid: int) -> bool:
        """The sandbox's process ``ns_pid`` exists and is not a zombie."""
        pid = self.host_pid(ns_pid)
        if pid is None:
            return False
        try:
            with open(f"/proc/{pid}/stat") as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            return False
        return state not in ("Z", "X")

    def wait_gone(self, ns_pids: list[int], timeout: float = 5.0) -> list[int]:
        deadline = time.monotonic() + timeout
        alive = [p for p in ns_pids if self.alive(p)]
        while alive and time.monotonic() < deadline:
            time.sleep(0.02)
            alive = [p for p in alive if self.alive(p)]
        return alive

    def kill(self, ns_pids: list[int]) -> None:
        """Clean-up after a failed test: SIGKILL exactly these sandbox processes."""
        for ns_pid in ns_pids:
            pid = self.host_pid(ns_pid)
            if pid is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
