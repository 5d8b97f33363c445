"""The per-sandbox root filesystem: an overlayfs over the image's read-only layers.

lowerdir = the image's layer folders (shared by every sandbox of that image,
never written), upperdir/workdir = the sandbox's own folders, mounted on the
host at ``sandboxes/<id>/rootfs``. Creating a sandbox therefore copies no image
data. ``volatile`` skips fsync on the upper dir: a sandbox's writes never need
to survive a host crash (a crashed sandbox is deleted, never remounted).
"""

from __future__ import annotations

import errno
from pathlib import Path

from ..base import BackendError
from . import syscalls

# mount(2) copies at most one page of options.
MAX_MOUNT_DATA = 4095


def overlay_options(lower_layers: list[Path], upper: Path, work: Path) -> str:
    """Mount options for ``lower_layers`` given lowest first (overlayfs wants top first)."""
    if not lower_layers:
        raise BackendError.failure("an image needs at least one layer")
    for path in (*lower_layers, upper, work):
        if any(ch in str(path) for ch in ",:\n"):
            raise BackendError.failure(f"path {path} cannot be used in overlay options")
    lower = ":".join(str(p) for p in reversed(lower_layers))
    data = f"lowerdir={lower},upperdir={upper},workdir={work},volatile"
    if len(data) > MAX_MOUNT_DATA:
        raise BackendError.failure(
            f"too many image layers for one overlay mount ({len(lower_layers)})"
        )
    return data


def mount_overlay(rootfs: Path, lower_layers: list[Path], upper: Path, work: Path) -> None:
    syscalls.mount("overlay", str(rootfs), "overlay", 0, overlay_options(lower_layers, upper, work))


def unmount_overlay(rootfs: Path) -> None:
    """Unmount the sandbox root if mounted; detach lazily if something still uses it."""
    try:
        while syscalls.umount(str(rootfs)):
            pass  # stacked mounts (should not happen) are all removed
    except OSError as err:
        if err.errno != errno.EBUSY:
            raise
        syscalls.umount(str(rootfs), lazy=True)


def is_mounted(path: Path) -> bool:
    """Whether ``path`` is a mount point in this mount namespace (from mountinfo)."""
    target = str(path)
    with open("/proc/self/mountinfo", encoding="utf-8", errors="replace") as mountinfo:
        for line in mountinfo:
            fields = line.split(" ", 5)
            if len(fields) > 4 and _unescape(fields[4]) == target:
                return True
    return False


def _unescape(field: str) -> str:
    # mountinfo escapes space, tab, newline and backslash as \ooo.
    if "\\" not in field:
        return field
    out: list[str] = []
    i = 0
    while i < len(field):
        if field[i] == "\\" and i + 4 <= len(field) and field[i + 1 : i + 4].isdigit():
            out.append(chr(int(field[i + 1 : i + 4], 8)))
            i += 4
        else:
            out.append(field[i])
            i += 1
    return "".join(out)
