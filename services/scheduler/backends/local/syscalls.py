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
