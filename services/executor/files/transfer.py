"""Streaming single-file read and atomic write inside a sandbox root.

Reads send a :class:`FileInfo` with the first chunk and then ~1 MiB chunks,
produced by one pool worker under backpressure, so memory stays at a few
chunks whatever the file size. The read is bounded by the size seen at open
time: a file that grows while being read (a log) still ends, and FileInfo.size
is never smaller than what is sent.

Writes go to a temp file in the target's directory and are renamed into place:
readers inside the sandbox see the old content or the new, never a mix, and on
any failure (client gone, disk full, refusal) the temp file is removed so
nothing half-written is left. The rename replaces the directory entry: if the
path is a symlink, the link itself is replaced by the new file (it is not
written through), which is what atomic writers (``mv``, editors) do. Writes
are not fsynced: a sandbox does not survive a node crash anyway.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import stat
from collections.abc import AsyncIterator, Callable, Iterable
from functools import partial
from pathlib import Path

from orchard._proto.orchard.v1 import executor_pb2
from orchard.common.errors import invalid, precondition

from .bridge import feed_thread, stream_from_thread
from .confined import ConfinedRoot, close_quietly
from .fserrors import INVALID_FIELD, IS_A_DIRECTORY, fs_error
from .owners import HostOwner
from .paths import SandboxPath, parse_sandbox_path

CHUNK_SIZE = 1 << 20
DEFAULT_FILE_MODE = 0o644
_TMP_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


def check_mode(mode: int) -> int:
    """The permission bits to give a written file: 0 means 0644.

    A full ``st_mode`` of a regular file (0o100644) is accepted for convenience;
    anything else outside 0o7777 is refused rather than guessed at.
    """
    if mode == 0:
        return DEFAULT_FILE_MODE
    if mode & ~0o7777 and stat.S_IFMT(mode) != stat.S_IFREG:
        raise invalid(f"mode {mode:#o} is not a set of permission bits (0..0o7777)", INVALID_FIELD)
    return mode & 0o7777


def write_all(fd: int, data: bytes | bytearray | memoryview) -> None:
    """os.write until everything is written (short writes happen on full disks)."""
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]


# -- read ----------------------------------------------------------------------


def _produce_file(
    root: Path, path: SandboxPath, same_mount: bool, send: Callable[[executor_pb2.FileChunk], None]
) -> None:
    with ConfinedRoot.open(root, same_mount=same_mount) as confined:
        fd, st = confined.open_regular(path)
    try:
        info = executor_pb2.FileInfo(size=st.st_size, mode=stat.S_IMODE(st.st_mode))
        remaining = st.st_size
        first = True
        while first or remaining > 0:
            try:
                data = os.read(fd, min(CHUNK_SIZE, remaining)) if remaining > 0 else b""
            except OSError as err:
                raise fs_error(err, path.display) from err
            if first:
                send(executor_pb2.FileChunk(info=info, data=data))
                first = False
            elif data:
                send(executor_pb2.FileChunk(data=data))
            if not data:
                break  # the file shrank while we read it
            remaining -= len(data)
    finally:
        os.close(fd)


async def read_file(
    root: Path, path: str, *, same_mount: bool = True
) -> AsyncIterator[executor_pb2.FileChunk]:
    """Stream a regular file of the sandbox: FileInfo on the first chunk, then data.

    Refusals (raised before any chunk): PATH_ESCAPE, PATH_NOT_FOUND,
    IS_A_DIRECTORY, UNSUPPORTED_FILE_TYPE (fifo, socket, device).
    """
    target = parse_sandbox_path(path)
    async for chunk in stream_from_thread(partial(_produce_file, root, target, same_mount)):
        yield chunk


# -- write ---------------------------------------------------------------------


def _existing(parent_fd: int, name: str) -> os.stat_result | None:
    try:
        return os.stat(name, dir_fd=parent_fd, follow_symlinks=False)
    except FileNotFoundError:
        return None


def _write_worker(
    root: Path,
    path: SandboxPath,
    mode: int,
    make_parents: bool,
    same_mount: bool,
    owner: int,
    named: HostOwner | None,
    chunks: Iterable[bytes],
) -> int:
    uid, gid = (named.uid, named.gid) if named else (owner, owner)
    with ConfinedRoot.open(root, same_mount=same_mount, owner=uid, group=gid) as confined:
        parent_fd = confined.open_dir(path.parent, create=make_parents)
    try:
        old = _existing(parent_fd, path.name)
        if old is not None and stat.S_ISDIR(old.st_mode):
            raise precondition(f"{path.display} is a directory", IS_A_DIRECTORY)
        tmp_name = f".orchard-write-{secrets.token_hex(8)}.tmp"
        fd = os.open(tmp_name, _TMP_FLAGS, 0o600, dir_fd=parent_fd)
        size = 0
        try:
            for chunk in chunks:
                write_all(fd, chunk)
                size += len(chunk)
            if named is not None:
                os.fchown(fd, named.uid, named.gid)
            elif old is not None:
                # Replacing a file keeps its owner (an agent's file stays the agent's).
                os.fchown(fd, old.st_uid, old.st_gid)
            else:
                confined.own_fd(fd)
            os.fchmod(fd, mode)  # after fchown, which clears setuid bits
            os.close(fd)
            fd = -1
            os.rename(tmp_name, path.name, src_dir_fd=parent_fd, dst_dir_fd=parent_fd)
        except BaseException:
            if fd >= 0:
                close_quietly(fd)
            with contextlib.suppress(OSError):
                os.unlink(tmp_name, dir_fd=parent_fd)
            raise
        return size
    except OSError as err:
        raise fs_error(err, path.display) from err
    finally:
        os.close(parent_fd)


async def write_file(
    root: Path,
    path: str,
    mode: int,
    make_parents: bool,
    data: AsyncIterator[bytes],
    *,
    same_mount: bool = True,
    owner: int = 0,
    named: HostOwner | None = None,
) -> int:
    """Write ``data`` to ``path`` atomically with ``mode``; return the size written.

    ``owner``: host uid/gid of the sandbox's root, owner of a new file and new parents.
    ``named``: the owner the client asked for (:mod:`.owners`), given the file (new or
    replaced) and the parents this call creates.

    Refusals: PATH_ESCAPE, PATH_NOT_FOUND (missing parent without
    make_parents), NOT_A_DIRECTORY (a parent is a file), IS_A_DIRECTORY,
    INVALID_FIELD (bad mode), RESOURCE_EXHAUSTED (disk full).
    """
    target = parse_sandbox_path(path)
    if not target.parts:
        raise precondition("/ is a directory", IS_A_DIRECTORY)
    file_mode = check_mode(mode)
    return await feed_thread(
        data,
        partial(_write_worker, root, target, file_mode, make_parents, same_mount, owner, named),
    )
