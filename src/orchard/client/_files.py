"""File operations beside read/write: the entry model and request building (no I/O).

The names follow the SDK's flat verbs (``read_file``, ``write_file``,
``upload``) rather than a ``files.`` sub-object: ``sb.list_dir``,
``sb.stat``, ``sb.exists``, ``sb.remove``, ``sb.rename``, ``sb.make_dir``.
They are E2B's ``files.list / get_info / exists / remove / rename /
make_dir`` (which agent code already calls) under the names Python's ``os``
and ``pathlib`` users expect, with Modal's ``rm(recursive=)`` guard: a
directory with something in it is only removed when asked (E2B's
``remove`` always removes whole trees, an easy way to lose a workspace).
Entries carry what ``os.stat`` gives (type, size, mode, mtime, owner) like
E2B's ``EntryInfo``; Modal's ``ls`` gives names only.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Literal

from orchard._proto.orchard.v1 import executor_pb2

from ._errors import InvalidRequestError, PathExistsError
from ._requests import check_remote_path

FileType = Literal[
    "file", "dir", "symlink", "fifo", "socket", "char_device", "block_device", "unknown"
]
Owner = str | int | tuple[int, int]
"""A user in the sandbox: a name ("agent"), a uid (1000), "name:group" or (uid, gid)."""

_TYPE_NAMES: dict[int, FileType] = {
    executor_pb2.FILE_TYPE_FILE: "file",
    executor_pb2.FILE_TYPE_DIRECTORY: "dir",
    executor_pb2.FILE_TYPE_SYMLINK: "symlink",
    executor_pb2.FILE_TYPE_FIFO: "fifo",
    executor_pb2.FILE_TYPE_SOCKET: "socket",
    executor_pb2.FILE_TYPE_CHAR_DEVICE: "char_device",
    executor_pb2.FILE_TYPE_BLOCK_DEVICE: "block_device",
}


@dataclass(frozen=True)
class FileEntry:
    """One entry of a sandbox's file system, as ``lstat`` / ``stat`` sees it."""

    name: str
    """The last path component ("" for "/")."""
    path: str
    """The sandbox path, below the path that was asked for (links not resolved)."""
    type: FileType
    size: int
    mode: int
    """Permission bits (``st_mode & 0o7777``)."""
    mtime: float
    """Modification time, seconds since the epoch (as ``os.stat_result.st_mtime``)."""
    uid: int
    gid: int
    """Owner as the sandbox sees it."""
    symlink_target: str | None = None
    """Where a symlink points, as stored; None for other entries."""

    @property
    def is_file(self) -> bool:
        return self.type == "file"

    @property
    def is_dir(self) -> bool:
        return self.type == "dir"

    @property
    def is_symlink(self) -> bool:
        return self.type == "symlink"

    @property
    def modified(self) -> dt.datetime:
        """``mtime`` as an aware UTC datetime."""
        return dt.datetime.fromtimestamp(self.mtime, tz=dt.UTC)


def file_entry(msg: executor_pb2.FileStat) -> FileEntry:
    return FileEntry(
        name=msg.name,
        path=msg.path,
        type=_TYPE_NAMES.get(msg.type, "unknown"),
        size=msg.size,
        mode=msg.mode,
        mtime=msg.mtime,
        uid=msg.uid,
        gid=msg.gid,
        symlink_target=msg.symlink_target or None,
    )


def owner_spec(owner: Owner | None) -> str:
    """The wire form of an owner ("" = the default)."""
    if owner is None:
        return ""
    if isinstance(owner, bool):
        raise InvalidRequestError("owner: a user name, a uid or (uid, gid), not a bool")
    if isinstance(owner, int):
        if owner < 0:
            raise InvalidRequestError(f"owner: uid {owner} is negative")
        return str(owner)
    if isinstance(owner, tuple):
        if len(owner) != 2 or any(
            isinstance(i, bool) or not isinstance(i, int) or i < 0 for i in owner
        ):
            raise InvalidRequestError(f"owner: {owner!r} is not a (uid, gid) pair")
        return f"{owner[0]}:{owner[1]}"
    if not owner.strip():
        raise InvalidRequestError("owner: empty user name")
    return owner


def list_request(
    sandbox_id: str, path: str, depth: int, max_entries: int | None
) -> executor_pb2.ListDirRequest:
    if depth < 1:
        raise InvalidRequestError(f"depth: must be at least 1 (got {depth})")
    if max_entries is not None and max_entries < 1:
        raise InvalidRequestError(f"max_entries: must be at least 1 (got {max_entries})")
    return executor_pb2.ListDirRequest(
        sandbox_id=sandbox_id,
        path=check_remote_path(path),
        depth=depth,
        max_entries=max_entries or 0,
    )


def stat_request(sandbox_id: str, path: str, follow_symlinks: bool) -> executor_pb2.StatRequest:
    return executor_pb2.StatRequest(
        sandbox_id=sandbox_id, path=check_remote_path(path), no_follow=not follow_symlinks
    )


def remove_request(sandbox_id: str, path: str, recursive: bool) -> executor_pb2.RemoveRequest:
    return executor_pb2.RemoveRequest(
        sandbox_id=sandbox_id, path=check_remote_path(path), recursive=recursive
    )


def rename_request(sandbox_id: str, source: str, destination: str) -> executor_pb2.RenameRequest:
    return executor_pb2.RenameRequest(
        sandbox_id=sandbox_id,
        source=check_remote_path(source, "source"),
        destination=check_remote_path(destination, "destination"),
    )


def make_dir_request(
    sandbox_id: str, path: str, parents: bool, mode: int | None, owner: Owner | None
) -> executor_pb2.MakeDirRequest:
    return executor_pb2.MakeDirRequest(
        sandbox_id=sandbox_id,
        path=check_remote_path(path),
        parents=parents,
        mode=mode or 0,
        owner=owner_spec(owner),
    )


def made_dir(created: bool, path: str, exist_ok: bool) -> bool:
    """``make_dir``'s answer: ``created``, or PathExistsError when it existed and must not."""
    if not created and not exist_ok:
        raise PathExistsError(
            f"{path} already exists", code="FAILED_PRECONDITION", reason="FILE_EXISTS"
        )
    return created
