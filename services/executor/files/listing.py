"""Stat and ListDir: metadata of entries in a sandbox, never following what it planted.

The path the client names is resolved in-root like every other call (a
symlinked directory on the way is followed as the sandbox would follow it).
Below it, a listing walks by directory fds only: each entry is ``fstatat``-ed
with ``AT_SYMLINK_NOFOLLOW`` relative to its directory's fd, and a child
directory is entered with openat2 ``RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS``
plus ``O_NOFOLLOW | O_DIRECTORY``, so a directory the sandbox swaps for a
symlink (to the host, to /proc) between our two calls is simply not entered,
and nothing but a directory is ever opened (no fifo, no device). Symlinks are
listed as symlinks (with their stored target), never followed.

A listing is a walk, not a snapshot: entries the sandbox removes meanwhile
are left out, ones it adds may or may not appear. It is bounded by ``depth``
(at most ``orchard.common.file_listing.MAX_DEPTH`` levels) and ``max_entries`` (``truncated`` says so).
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

from orchard._proto.orchard.v1 import executor_pb2 as pb
from orchard.common.errors import invalid, precondition
from orchard.common.file_listing import file_type, listing_bounds

from .confined import O_PATH, ConfinedRoot, reopen
from .fserrors import INVALID_FIELD, NOT_A_DIRECTORY, fs_error
from .openat2 import RESOLVE_NO_SYMLINKS, openat2
from .paths import SandboxPath

_DIR_READ = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


def _sandbox_id(host_id: int, base: int) -> int:
    """An owner id as the sandbox sees it (ids outside its range show as nobody)."""
    inside = host_id - base
    return inside if 0 <= inside < (1 << 32) - 1 else 65534


def file_stat(st: os.stat_result, path: SandboxPath, base: int, target: str = "") -> pb.FileStat:
    """The FileStat message for ``st`` found at ``path``."""
    return pb.FileStat(
        name=path.name,
        path=path.display,
        type=file_type(st.st_mode),
        size=st.st_size,
        mode=stat.S_IMODE(st.st_mode),
        mtime=st.st_mtime,
        uid=_sandbox_id(st.st_uid, base),
        gid=_sandbox_id(st.st_gid, base),
        symlink_target=target,
    )


def _readlink(name: str, dir_fd: int) -> str:
    try:
        return os.readlink(name, dir_fd=dir_fd)
    except OSError:
        return ""  # replaced meanwhile: the entry is still reported, without a target


def stat_entry(
    root: Path, path: SandboxPath, *, follow: bool, same_mount: bool = True, base: int = 0
) -> pb.FileStat:
    """Stat ``path`` (in-root); ``follow=False`` describes a final symlink itself."""
    with ConfinedRoot.open(root, same_mount=same_mount) as confined:
        fd, st = confined.stat_path(path, follow=follow)
        try:
            target = _readlink("", fd) if stat.S_ISLNK(st.st_mode) else ""
        finally:
            os.close(fd)
    return file_stat(st, path, base, target)


def check_listing(depth: int, max_entries: int) -> tuple[int, int]:
    """(depth, max_entries) with defaults applied; INVALID_ARGUMENT beyond the bounds."""
    depth, max_entries, error = listing_bounds(depth, max_entries)
    if error:
        raise invalid(error, INVALID_FIELD)
    return depth, max_entries


def _enter(dir_fd: int, name: str, resolve: int) -> int | None:
    """A readable fd on the child directory ``name``, or None if it is no longer one."""
    try:
        return openat2(dir_fd, name, _DIR_READ, 0, resolve | RESOLVE_NO_SYMLINKS)
    except OSError as err:
        if err.errno in (errno.ENOENT, errno.ENOTDIR, errno.ELOOP, errno.EXDEV, errno.EACCES):
            return None  # gone, swapped for a non-directory or a link, or another mount
        raise


def _names(dir_fd: int) -> list[str]:
    # listdir on an fd reads that directory (dup'd internally), never a path.
    return sorted(os.listdir(dir_fd))


def list_dir(
    root: Path,
    path: SandboxPath,
    depth: int,
    max_entries: int,
    *,
    same_mount: bool = True,
    base: int = 0,
) -> tuple[list[pb.FileStat], bool]:
    """The entries below ``path`` (depth-first, sorted by name per directory) and whether
    the listing stopped at ``max_entries``. At most ``depth`` directory fds are open."""
    with ConfinedRoot.open(root, same_mount=same_mount) as confined:
        top = confined.openat(path, O_PATH)
        try:
            if not stat.S_ISDIR(os.fstat(top).st_mode):
                raise precondition(f"{path.display} is not a directory", NOT_A_DIRECTORY)
            top_fd = reopen(top, os.O_RDONLY | os.O_DIRECTORY | os.O_NONBLOCK)
        except OSError as err:
            raise fs_error(err, path.display) from err
        finally:
            os.close(top)
        walk = _Walk(depth, max_entries, confined.resolve_beneath, base)
        try:
            walk.directory(top_fd, path, 1)
        except OSError as err:
            raise fs_error(err, path.display) from err
        finally:
            os.close(top_fd)
    return walk.entries, walk.full


class _Walk:
    """One bounded depth-first listing (recursion depth <= MAX_DEPTH)."""

    def __init__(self, depth: int, max_entries: int, resolve: int, base: int) -> None:
        self.depth = depth
        self.max_entries = max_entries
        self.resolve = resolve
        self.base = base
        self.entries: list[pb.FileStat] = []
        self.full = False

    def directory(self, dir_fd: int, where: SandboxPath, level: int) -> None:
        for name in _names(dir_fd):
            if len(self.entries) >= self.max_entries:
                self.full = True
                return
            try:
                st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
            except FileNotFoundError:
                continue  # removed since the listing: not there any more
            child = where.child(name)
            target = _readlink(name, dir_fd) if stat.S_ISLNK(st.st_mode) else ""
            self.entries.append(file_stat(st, child, self.base, target))
            if stat.S_ISDIR(st.st_mode) and level < self.depth:
                fd = _enter(dir_fd, name, self.resolve)
                if fd is None:
                    continue
                try:
                    self.directory(fd, child, level + 1)
                finally:
                    os.close(fd)
                if self.full:
                    return
