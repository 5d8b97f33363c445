"""ListDir, Stat, Remove, Rename and MakeDir of the fake executor.

Same answers and refusals as ``services/executor/files`` (listing.py,
removal.py, directories.py), resolved in user space through
:func:`._files.resolve` (see that module for why that is acceptable in a
fake). Owners named on writes are checked against the sandbox's
/etc/passwd like the real executor does, but only applied when the fake runs
as root (it cannot chown otherwise); the fake reports the host's ids.
"""

from __future__ import annotations

import errno
import os
import shutil
import stat
from pathlib import Path

from orchard._proto.orchard.v1 import executor_pb2 as pb
from orchard.common.file_listing import DEFAULT_DIR_MODE, file_type, listing_bounds

from ._files import clean_parts, display, fs_error, resolve
from ._status import invalid, not_found, precondition


def _entry(host: Path, parts: tuple[str, ...], st: os.stat_result) -> pb.FileStat:
    kind = file_type(st.st_mode)
    return pb.FileStat(
        name=parts[-1] if parts else "",
        path=display(parts),
        type=kind,
        size=st.st_size,
        mode=stat.S_IMODE(st.st_mode),
        mtime=st.st_mtime,
        uid=st.st_uid,
        gid=st.st_gid,
        symlink_target=os.readlink(host) if stat.S_ISLNK(st.st_mode) else "",
    )


def _lstat(host: Path, shown: str) -> os.stat_result:
    try:
        return os.lstat(host)
    except OSError as err:
        raise fs_error(err, shown) from err


def stat_entry(root: Path, path: str, follow: bool) -> pb.FileStat:
    parts = clean_parts(path)
    host = resolve(root, parts, follow_last=follow)
    return _entry(host, parts, _lstat(host, display(parts)))


def list_dir(root: Path, path: str, depth: int, max_entries: int) -> pb.ListDirResponse:
    parts = clean_parts(path)
    depth, limit, error = listing_bounds(depth, max_entries)
    if error:
        raise invalid(error, "INVALID_FIELD")
    top = resolve(root, parts)
    if not stat.S_ISDIR(_lstat(top, display(parts)).st_mode):
        raise precondition(f"{display(parts)} is not a directory", "NOT_A_DIRECTORY")
    entries: list[pb.FileStat] = []

    def walk(host: Path, where: tuple[str, ...], level: int) -> bool:
        for name in sorted(os.listdir(host)):
            if len(entries) >= limit:
                return True
            child = host / name
            st = os.lstat(child)
            entries.append(_entry(child, (*where, name), st))
            if (
                stat.S_ISDIR(st.st_mode)
                and level < depth
                and walk(child, (*where, name), level + 1)
            ):
                return True
        return False

    truncated = walk(top, parts, 1)
    return pb.ListDirResponse(entries=entries, truncated=truncated)


def remove(root: Path, path: str, recursive: bool) -> int:
    parts = clean_parts(path)
    if not parts:
        raise precondition("/ cannot be removed", "IS_A_DIRECTORY")
    host = resolve(root, parts, follow_last=False)
    st = _lstat(host, display(parts))
    if not stat.S_ISDIR(st.st_mode):
        host.unlink()
        return 1
    if not recursive:
        if any(host.iterdir()):
            raise precondition(
                f"{display(parts)} is a directory that is not empty; remove it recursively",
                "IS_A_DIRECTORY",
            )
        host.rmdir()
        return 1
    count = 1 + sum(len(dirs) + len(files) for _, dirs, files in os.walk(host))
    shutil.rmtree(host)  # the fake's tree is the test's own: no hostile swaps to fear
    return count


def rename(root: Path, source: str, destination: str) -> None:
    src = clean_parts(source, "source")
    dst = clean_parts(destination, "destination")
    if not src or not dst:
        raise precondition("/ cannot be renamed, nor replaced", "ERROR_REASON_UNSPECIFIED")
    if dst[: len(src)] == src and dst != src:
        raise invalid(f"cannot move {display(src)} into itself ({display(dst)})", "INVALID_FIELD")
    src_host = resolve(root, src, follow_last=False)
    dst_host = resolve(root, dst, follow_last=False)
    _lstat(src_host, display(src))
    try:
        os.rename(src_host, dst_host)
    except OSError as err:
        if err.errno in (errno.ENOTEMPTY, errno.EEXIST):
            raise precondition(
                f"{display(dst)} is a directory that is not empty", "FILE_EXISTS"
            ) from err
        raise fs_error(err, f"{display(src)} -> {display(dst)}") from err


def make_dir(root: Path, path: str, parents: bool, mode: int) -> bool:
    parts = clean_parts(path)
    if mode & ~0o7777:
        raise invalid(
            f"mode {mode:#o} is not a set of permission bits (0..0o7777)", "INVALID_FIELD"
        )
    host = resolve(root, parts)
    if host.is_dir():
        return False
    if os.path.lexists(host):
        raise precondition(f"{display(parts)} exists and is not a directory", "FILE_EXISTS")
    parent = resolve(root, parts[:-1])
    if not parent.exists():
        if not parents:
            raise not_found(f"{display(parts[:-1])} does not exist", "PATH_NOT_FOUND")
        make_dir(root, display(parts[:-1]), True, 0)
        parent = resolve(root, parts[:-1])
    try:
        os.mkdir(parent / parts[-1])
        os.chmod(parent / parts[-1], mode or DEFAULT_DIR_MODE)
    except OSError as err:
        raise fs_error(err, display(parts)) from err
    return True
