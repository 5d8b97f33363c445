"""Where runc puts a sandbox's cgroups on this host, and removing what it leaves.

On this kind of machine the hierarchy is cgroup v1 "hybrid": one v1 hierarchy
per controller under ``/sys/fs/cgroup/<controller>`` plus an empty v2 tree at
``/sys/fs/cgroup/unified``. runc (cgroupsPath ``/orchard/<id>``) makes
``<mount>/orchard/<id>`` in every one of them, the v2 one and
``name=systemd`` included; ``runc delete`` removes them, but a crash between
``runc create`` and ``delete`` can leave empty ones behind, so delete sweeps
every cgroup mount found in /proc/self/mountinfo.
"""

from __future__ import annotations

import errno
import functools
import os
import time
from pathlib import Path

from .oci_config import CGROUP_PARENT

DEFAULT_MEMORY_MOUNT = Path("/sys/fs/cgroup/memory")


@functools.lru_cache(maxsize=1)
def cgroup_mounts() -> tuple[tuple[Path, frozenset[str]], ...]:
    """(mount point, controllers) of every cgroup and cgroup2 mount of this host."""
    mounts: list[tuple[Path, frozenset[str]]] = []
    with open("/proc/self/mountinfo", encoding="utf-8", errors="replace") as mountinfo:
        for line in mountinfo:
            before, _, after = line.partition(" - ")
            fields = before.split()
            tail = after.split()
            if len(fields) < 5 or len(tail) < 3 or tail[0] not in ("cgroup", "cgroup2"):
                continue
            options = frozenset(tail[2].split(",")) if tail[0] == "cgroup" else frozenset()
            mounts.append((Path(fields[4]), options))
    return tuple(mounts)


def memory_cgroup_dir(sandbox_id: str) -> Path:
    """Host path of the sandbox's v1 memory cgroup (``memory.oom_control`` lives there)."""
    for mount_point, options in cgroup_mounts():
        if "memory" in options:
            return mount_point / CGROUP_PARENT / sandbox_id
    return DEFAULT_MEMORY_MOUNT / CGROUP_PARENT / sandbox_id


def sandbox_cgroup_dirs(sandbox_id: str) -> list[Path]:
    """Every cgroup folder of the sandbox that exists now, in any hierarchy."""
    found: list[Path] = []
    for mount_point, _ in cgroup_mounts():
        path = mount_point / CGROUP_PARENT / sandbox_id
        if path.is_dir():
            found.append(path)
    return found


def remove_sandbox_cgroups(sandbox_id: str, attempts: int = 20) -> list[Path]:
    """rmdir the sandbox's leftover cgroups; returns those that could not be removed.

    A cgroup can only be removed once its last process has exited, which can
    lag a SIGKILL by a few milliseconds, so EBUSY is retried briefly.
    """
    remaining = sandbox_cgroup_dirs(sandbox_id)
    for attempt in range(attempts):
        still: list[Path] = []
        for path in remaining:
            try:
                os.rmdir(path)
            except FileNotFoundError:
                pass
            except OSError as err:
                if err.errno != errno.EBUSY:
                    raise
                still.append(path)
        remaining = still
        if not remaining:
            break
        time.sleep(0.005 * (attempt + 1))
    return remaining
