"""How many times the kernel OOM-killed a process in a sandbox's memory cgroup.

``oom_killed`` is decided by reading the counter before and after a command:
if it rose and the command died of SIGKILL, the OOM killer is the likely
cause. cgroup v1 keeps it in ``memory.oom_control`` (``oom_kill N``), v2 in
``memory.events``.
"""

from __future__ import annotations

import os


def read_oom_kills(cgroup_dir: str) -> int | None:
    """The cgroup's oom_kill counter, or None if it cannot be read."""
    for name in ("memory.oom_control", "memory.events"):
        try:
            with open(os.path.join(cgroup_dir, name), "rb") as f:
                text = f.read(4096)
        except OSError:
            continue
        for line in text.splitlines():
            key, _, value = line.partition(b" ")
            if key == b"oom_kill" and value.strip().isdigit():
                return int(value)
    return None
