"""A sandbox's writable layer on its own tmpfs, capped at a size, mounted nowhere.

Why tmpfs: on this kind of VM ext4 creates ~2k files/s, and every create and
delete of a sandbox made and unlinked inodes there (``recently_deleted`` scans
showed in the kernel profile of 1000 concurrent creates; ``rmtree`` of the
upper/work dirs was a quarter of the scheduler's samples). A tmpfs writes at
memory speed and goes away with the overlay. Its ``size=`` is the sandbox's
disk quota: a disk fill inside ends in ENOSPC at the cap.

Why "mounted nowhere": every mount in the host's mount table costs every later
``runc run`` (the new mount namespace copies the table, runc and runc init parse
/proc/self/mountinfo, pivot_root detaches the old root): measured +21 ms of CPU
per create per 1000 host mounts. So the tmpfs is made with the new mount API
(``fsopen``/``fsmount``: a detached mount, in no mount table), the overlay takes
its upper and work dirs by file descriptor (Linux 6.13+), and only the overlay
is attached, at ``rootfs``: one host mount per sandbox, as without tmpfs. The
tmpfs lives as long as the overlay does; unmounting the overlay frees it.

The trade-off: tmpfs pages are memory, charged to the memory cgroup of the
process that writes them, i.e. to the sandbox's own ``memory_bytes`` (measured
in docs/benchmarks.md, "Create/delete at scale"): files count against the
sandbox's memory limit and cannot use the node's memory beyond it.
``sandbox_disk_bytes = 0`` keeps upper/work on the home's filesystem instead.
"""

from __future__ import annotations

import os
from pathlib import Path

from . import syscalls


def mount_overlay_on_tmpfs(rootfs: Path, lower_layers: list[Path], size_bytes: int) -> None:
    """Mount at ``rootfs`` an overlay of ``lower_layers`` (lowest first) whose upper and
    work dirs are on a fresh, detached tmpfs of ``size_bytes``."""
    fds: list[int] = []
    try:
        tmpfs = syscalls.fsopen("tmpfs")
        fds.append(tmpfs)
        syscalls.fsconfig_string(tmpfs, "size", str(size_bytes))
        syscalls.fsconfig_string(tmpfs, "mode", "0700")
        syscalls.fsconfig_create(tmpfs)
        scratch = syscalls.fsmount(tmpfs)
        fds.append(scratch)
        layer_fds = {}
        for name in ("upper", "work"):
            os.mkdir(name, 0o755, dir_fd=scratch)
            layer_fds[name] = os.open(name, os.O_PATH | os.O_DIRECTORY, dir_fd=scratch)
            fds.append(layer_fds[name])
        overlay = syscalls.fsopen("overlay")
        fds.append(overlay)
        for layer in reversed(lower_layers):  # overlayfs wants the top layer first
            syscalls.fsconfig_string(overlay, "lowerdir+", str(layer))
        syscalls.fsconfig_fd(overlay, "upperdir", layer_fds["upper"])
        syscalls.fsconfig_fd(overlay, "workdir", layer_fds["work"])
        syscalls.fsconfig_flag(overlay, "volatile")
        syscalls.fsconfig_create(overlay)
        mounted = syscalls.fsmount(overlay)
        fds.append(mounted)
        syscalls.move_mount(mounted, str(rootfs))
    finally:
        for fd in fds:
            os.close(fd)


class ScratchUnsupported(RuntimeError):
    """This kernel cannot give sandboxes a tmpfs writable layer the way we mount it."""


def check_supported(work_dir: Path) -> None:
    """Mount and unmount one tiny overlay-on-tmpfs under ``work_dir``, once at start-up,
    so an old kernel fails here with a message that says what to do, not on every
    create with a bare errno."""
    probe = work_dir / ".scratch-probe"
    lower, target = probe / "lower", probe / "root"
    for folder in (lower, target):
        folder.mkdir(parents=True, exist_ok=True)
    try:
        mount_overlay_on_tmpfs(target, [lower], 1 << 20)
    except OSError as err:
        raise ScratchUnsupported(
            f"per-sandbox tmpfs writable layers need Linux 6.13+ (overlayfs layers passed by "
            f"file descriptor); this kernel is {os.uname().release} and refused it: {err}. "
            "Set ORCHARD_SANDBOX_DISK_BYTES=0 to keep sandboxes' upper dirs on the home's "
            "filesystem (then without a per-sandbox disk quota)."
        ) from err
    syscalls.umount(str(target))
    for folder in (lower, target, probe):
        folder.rmdir()
