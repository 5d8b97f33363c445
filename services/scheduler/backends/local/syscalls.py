"""Thin ctypes wrappers over the few syscalls the hot path needs.

Spawning ``mount``/``umount`` per sandbox would cost a process each (~1-2 ms
and a fork from a possibly large parent); calling libc directly costs
microseconds and is safe from any thread.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import os

MS_NOSUID = 0x2
MS_NODEV = 0x4
MNT_DETACH = 0x2
UMOUNT_NOFOLLOW = 0x8

_libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
_libc.mount.argtypes = [
    ctypes.c_char_p,
    ctypes.c_char_p,
    ctypes.c_char_p,
    ctypes.c_ulong,
    ctypes.c_char_p,
]
_libc.mount.restype = ctypes.c_int
_libc.umount2.argtypes = [ctypes.c_char_p, ctypes.c_int]
_libc.umount2.restype = ctypes.c_int


def mount(source: str, target: str, fstype: str, flags: int = 0, data: str = "") -> None:
    if (
        _libc.mount(source.encode(), target.encode(), fstype.encode(), flags, data.encode() or None)
        != 0
    ):
        err = ctypes.get_errno()
        raise OSError(err, f"mount {fstype} on {target}: {os.strerror(err)}")


def umount(target: str, *, lazy: bool = False) -> bool:
    """Unmount ``target``; False when nothing was mounted there (EINVAL/ENOENT)."""
    flags = UMOUNT_NOFOLLOW | (MNT_DETACH if lazy else 0)
    if _libc.umount2(target.encode(), flags) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.EINVAL, errno.ENOENT):
        return False
    raise OSError(err, f"umount {target}: {os.strerror(err)}")


# The new mount API (Linux 5.2+; layers by fd for overlayfs: 6.13+), x86_64 numbers.
SYS_MOVE_MOUNT = 429
SYS_FSOPEN = 430
SYS_FSCONFIG = 431
SYS_FSMOUNT = 432
FSOPEN_CLOEXEC = 0x1
FSMOUNT_CLOEXEC = 0x1
FSCONFIG_SET_FLAG = 0
FSCONFIG_SET_STRING = 1
FSCONFIG_SET_FD = 5
FSCONFIG_CMD_CREATE = 6
MOVE_MOUNT_F_EMPTY_PATH = 0x4
AT_FDCWD = -100
_libc.syscall.restype = ctypes.c_long


def _checked(result: int, what: str) -> int:
    if result < 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")
    return result


def fsopen(fstype: str) -> int:
    """A filesystem context fd for ``fstype`` (close-on-exec)."""
    return _checked(
        _libc.syscall(ctypes.c_long(SYS_FSOPEN), fstype.encode(), ctypes.c_uint(FSOPEN_CLOEXEC)),
        f"fsopen {fstype}",
    )


def fsconfig_flag(context: int, key: str) -> None:
    _checked(
        _libc.syscall(
            ctypes.c_long(SYS_FSCONFIG), ctypes.c_int(context), ctypes.c_uint(FSCONFIG_SET_FLAG),
            key.encode(), None, ctypes.c_int(0),
        ),
        f"fsconfig {key}",
    )  # fmt: skip


def fsconfig_string(context: int, key: str, value: str) -> None:
    _checked(
        _libc.syscall(
            ctypes.c_long(SYS_FSCONFIG), ctypes.c_int(context), ctypes.c_uint(FSCONFIG_SET_STRING),
            key.encode(), value.encode(), ctypes.c_int(0),
        ),
        f"fsconfig {key}={value}",
    )  # fmt: skip


def fsconfig_fd(context: int, key: str, fd: int) -> None:
    _checked(
        _libc.syscall(
            ctypes.c_long(SYS_FSCONFIG), ctypes.c_int(context), ctypes.c_uint(FSCONFIG_SET_FD),
            key.encode(), None, ctypes.c_int(fd),
        ),
        f"fsconfig {key} (fd)",
    )  # fmt: skip


def fsconfig_create(context: int) -> None:
    _checked(
        _libc.syscall(
            ctypes.c_long(SYS_FSCONFIG), ctypes.c_int(context), ctypes.c_uint(FSCONFIG_CMD_CREATE),
            None, None, ctypes.c_int(0),
        ),
        "fsconfig create",
    )  # fmt: skip


def fsmount(context: int) -> int:
    """A detached mount of the created filesystem: in no namespace's mount table."""
    return _checked(
        _libc.syscall(
            ctypes.c_long(SYS_FSMOUNT), ctypes.c_int(context), ctypes.c_uint(FSMOUNT_CLOEXEC),
            ctypes.c_uint(0),
        ),
        "fsmount",
    )  # fmt: skip


def move_mount(mount_fd: int, target: str) -> None:
    """Attach the detached mount ``mount_fd`` at ``target``."""
    _checked(
        _libc.syscall(
            ctypes.c_long(SYS_MOVE_MOUNT), ctypes.c_int(mount_fd), b"", ctypes.c_int(AT_FDCWD),
            target.encode(), ctypes.c_uint(MOVE_MOUNT_F_EMPTY_PATH),
        ),
        f"move_mount to {target}",
    )  # fmt: skip


# Idmapped mounts (Linux 5.12+; overlayfs over idmapped layers: 5.19+), for user namespaces.
SYS_OPEN_TREE = 428
SYS_MOUNT_SETATTR = 442
OPEN_TREE_CLONE = 0x1
OPEN_TREE_CLOEXEC = os.O_CLOEXEC
AT_EMPTY_PATH = 0x1000
AT_RECURSIVE = 0x8000
MOUNT_ATTR_IDMAP = 0x00100000


class _MountAttr(ctypes.Structure):
    _fields_ = [
        ("attr_set", ctypes.c_uint64),
        ("attr_clr", ctypes.c_uint64),
        ("propagation", ctypes.c_uint64),
        ("userns_fd", ctypes.c_uint64),
    ]


def open_tree(path: str, *, recursive: bool = False) -> int:
    """A detached clone of the mount at ``path`` (close-on-exec), in no mount table;
    ``recursive``: with the mounts below it (a recursive bind)."""
    flags = OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC | (AT_RECURSIVE if recursive else 0)
    return _checked(
        _libc.syscall(
            ctypes.c_long(SYS_OPEN_TREE), ctypes.c_int(AT_FDCWD), path.encode(),
            ctypes.c_uint(flags),
        ),
        f"open_tree {path}",
    )  # fmt: skip


def mount_setattr_idmap(mount_fd: int, userns_fd: int) -> None:
    """Idmap the detached mount ``mount_fd`` through the user namespace ``userns_fd``."""
    attr = _MountAttr(MOUNT_ATTR_IDMAP, 0, 0, userns_fd)
    _checked(
        _libc.syscall(
            ctypes.c_long(SYS_MOUNT_SETATTR), ctypes.c_int(mount_fd), b"",
            ctypes.c_uint(AT_EMPTY_PATH), ctypes.byref(attr), ctypes.c_size_t(ctypes.sizeof(attr)),
        ),
        "mount_setattr MOUNT_ATTR_IDMAP",
    )  # fmt: skip
