"""Where runc puts a sandbox's cgroups on this host, and removing what it leaves.

On this kind of machine the hierarchy is cgroup v1 "hybrid": one v1 hierarchy
per controller under ``/sys/fs/cgroup/<controller>`` plus an empty v2 tree at
``/sys/fs/cgroup/unified``. runc (cgroupsPath ``/orchard/<group>/<id>``, the
group being the tenant's: ``oci_config.tenant_group``) makes
``<mount>/orchard/<group>/<id>`` in every one of them, the v2 one and
``name=systemd`` included. Delete removes the sandbox's own folders in every
cgroup mount found in /proc/self/mountinfo (a crash half-way through a create
can leave empty ones behind). The group folders stay while the backend runs (a
create in the same group may be between runc's two mkdirs); the backend removes
the empty ones when it closes (``remove_empty_groups``).
"""

from __future__ import annotations

import contextlib
import errno
import functools
import os
import time
from pathlib import Path

from .oci_config import (
    CGROUP_PARENT,
    POOL_GROUP,
    RUNNING_CPU_SHARES,
    STARTING_CPU_SHARES,
    TENANT_GROUP_RE,
    cgroups_path,
)

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


def _relative(sandbox_id: str, tenant: str) -> Path:
    """The sandbox's folder under each cgroup mount: runc's cgroupsPath, made relative."""
    return Path(cgroups_path(sandbox_id, tenant).lstrip("/"))


def memory_cgroup_dir(sandbox_id: str, tenant: str = "") -> Path:
    """Host path of the sandbox's v1 memory cgroup (``memory.oom_control`` lives there)."""
    relative = _relative(sandbox_id, tenant)
    for mount_point, options in cgroup_mounts():
        if "memory" in options:
            return mount_point / relative
    return DEFAULT_MEMORY_MOUNT / relative


def cpu_cgroup_dirs(sandbox_id: str, tenant: str = "") -> list[Path]:
    """Where the sandbox's CPU weight lives: the v1 ``cpu`` hierarchy, and any cgroup2
    mount (which has ``cpu.weight`` only where the cpu controller is enabled there)."""
    relative = _relative(sandbox_id, tenant)
    return [
        mount_point / relative
        for mount_point, options in cgroup_mounts()
        if "cpu" in options or not options
    ]


def set_cpu_weight(cgroup_dirs: list[Path], *, starting: bool) -> None:
    """The sandbox's CPU weight: the top one while it starts or is torn down, else the default.

    ``cgroup_dirs``: its cgroup folders (``cpu_cgroup_dirs``, or all of them from
    ``sandbox_cgroup_dirs``); those without a weight file are skipped, and so is
    a sandbox whose cgroups are gone. See ``oci_config.STARTING_CPU_SHARES`` for why.
    """
    shares = STARTING_CPU_SHARES if starting else RUNNING_CPU_SHARES
    for path in cgroup_dirs:
        for name, value in (
            ("cpu.shares", shares),
            # runc's own v1 -> v2 conversion of shares into a weight (1..10000).
            ("cpu.weight", 1 + ((shares - 2) * 9999) // 262_142),
        ):
            weight_file = path / name
            if not weight_file.exists():  # not this kind of hierarchy (cgroupfs refuses a new file)
                continue
            with contextlib.suppress(FileNotFoundError):  # the sandbox went meanwhile
                weight_file.write_text(str(value))
            break


def _group_dirs(mount_point: Path) -> list[Path]:
    """The tenant and pool group folders under ``<mount>/orchard``."""
    try:
        entries = list(os.scandir(mount_point / CGROUP_PARENT))
    except (FileNotFoundError, NotADirectoryError):
        return []
    return [
        Path(entry.path)
        for entry in entries
        if (entry.name == POOL_GROUP or TENANT_GROUP_RE.match(entry.name))
        and entry.is_dir(follow_symlinks=False)
    ]


def sandbox_cgroup_dirs(sandbox_id: str) -> list[Path]:
    """Every cgroup folder of the sandbox that exists now, in any hierarchy and group.

    Found by looking (not from its record): a create that died half-way may
    have left folders and no record. Also looks directly under ``orchard``,
    where sandboxes made before tenant groups lived.
    """
    found: list[Path] = []
    for mount_point, _ in cgroup_mounts():
        for parent in (mount_point / CGROUP_PARENT, *_group_dirs(mount_point)):
            path = parent / sandbox_id
            if path.is_dir():
                found.append(path)
    return found


def remove_empty_groups() -> int:
    """rmdir the tenant/pool group folders that hold no sandbox any more; returns how many."""
    removed = 0
    for mount_point, _ in cgroup_mounts():
        for group in _group_dirs(mount_point):
            try:
                os.rmdir(group)
            except OSError as err:
                if err.errno not in (errno.EBUSY, errno.ENOENT, errno.ENOTEMPTY):
                    raise
            else:
                removed += 1
    return removed


def remove_sandbox_cgroups(
    sandbox_id: str, attempts: int = 20, found: list[Path] | None = None
) -> list[Path]:
    """rmdir the sandbox's leftover cgroups; returns those that could not be removed.

    ``found``: its folders as ``sandbox_cgroup_dirs`` listed them a moment ago
    (saves looking again). A cgroup can only be removed once its last process
    has exited, which can lag a SIGKILL by a few milliseconds, so EBUSY is
    retried briefly.
    """
    remaining = list(found) if found is not None else sandbox_cgroup_dirs(sandbox_id)
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
