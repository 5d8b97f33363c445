"""openat2(2) through ctypes, because the os module does not expose it.

openat2 is what makes the file service safe: with ``RESOLVE_IN_ROOT`` the kernel
resolves a path as if the directory fd were ``/`` (absolute symlinks and ``..``
stay inside it), atomically, at lookup time, so a sandbox that swaps a
directory for a symlink between our calls cannot make us leave its rootfs.
Doing the same in user space (readlink, lstat, component by component) is
racy by construction.
"""

from __future__ import annotations

import ctypes
import errno
import os

# The syscall number is the same on every architecture using the generic table
# (x86_64, aarch64, riscv64...): 437 since Linux 5.6.
SYS_OPENAT2 = 437

RESOLVE_NO_XDEV = 0x01
RESOLVE_NO_MAGICLINKS = 0x02
RESOLVE_NO_SYMLINKS = 0x04
RESOLVE_BENEATH = 0x08
RESOLVE_IN_ROOT = 0x10

# How often a lookup that raced with a rename (EAGAIN) or a signal is retried.
_RETRIES = 64


class _OpenHow(ctypes.Structure):
    _fields_ = [
        ("flags", ctypes.c_uint64),
        ("mode", ctypes.c_uint64),
        ("resolve", ctypes.c_uint64),
    ]


_libc = ctypes.CDLL(None, use_errno=True)
_syscall = _libc.syscall
_syscall.restype = ctypes.c_long
_syscall.argtypes = [
    ctypes.c_long,
    ctypes.c_int,
    ctypes.c_char_p,
    ctypes.POINTER(_OpenHow),
    ctypes.c_size_t,
]


class Openat2Unavailable(OSError):
    """The kernel has no openat2 (Linux < 5.6); there is no safe fallback."""


def openat2(dirfd: int, path: str | bytes, flags: int, mode: int = 0, resolve: int = 0) -> int:
    """Open ``path`` relative to ``dirfd``; return the new fd or raise OSError.

    ``flags`` should include ``O_CLOEXEC`` (openat2 does not add it for us, and
    the executor never wants its fds inherited). ``mode`` must be 0 unless
    ``O_CREAT`` is set: the kernel rejects it with EINVAL otherwise.
    """
    raw = os.fsencode(path)
    how = _OpenHow(flags, mode, resolve)
    for _ in range(_RETRIES):
        fd = int(_syscall(SYS_OPENAT2, dirfd, raw, ctypes.byref(how), ctypes.sizeof(how)))
        if fd >= 0:
            return fd
        err = ctypes.get_errno()
        if err in (errno.EINTR, errno.EAGAIN):
            continue
        if err == errno.ENOSYS:
            raise Openat2Unavailable(err, "openat2 is not available (needs Linux >= 5.6)")
        raise OSError(err, os.strerror(err), os.fsdecode(raw))
    raise OSError(errno.EAGAIN, "path lookup kept racing with renames", os.fsdecode(raw))
