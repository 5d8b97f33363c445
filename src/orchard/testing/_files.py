"""File calls of the fake executor, confined to a sandbox's host directory.

Paths are sandbox paths mapped under the sandbox's root directory. They are
cleaned lexically first (a ``..`` that climbs above ``/`` is PATH_ESCAPE, as
in ``services/executor/files/paths.py``), then resolved one component at a
time here, in user space: a symlink is followed the way the sandbox would
see it (an absolute target starts again at the sandbox root, ``..`` in a
target stops at the root), so no name and no link reaches outside the root.
The real executor gets the same semantics from the kernel (openat2
``RESOLVE_IN_ROOT``); resolving in user space is racy against a process that
swaps a directory for a symlink between two steps, which is acceptable here
only because the fake's commands are not confined anyway (see the package
docstring). Tar streams are read and written with the standard library's
``tarfile`` (every member is checked before anything is placed).
"""

from __future__ import annotations

import contextlib
import errno
import io
import os
import secrets
import stat
import tarfile
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path

import grpc

from orchard._proto.orchard.v1 import executor_pb2

from ._status import Refusal, escape, invalid, not_found, precondition

CHUNK_SIZE = 1 << 20
MAX_LINKS = 40
MAX_PATH_BYTES = 4096
DEFAULT_FILE_MODE = 0o644


def fs_error(err: OSError, what: str) -> Refusal:
    """An OSError met while working on the sandbox path ``what``, as the real executor reports it."""
    code = err.errno
    if code == errno.ENOENT:
        return not_found(f"{what} does not exist", "PATH_NOT_FOUND")
    if code == errno.ENOTDIR:
        return precondition(
            f"{what}: a component of the path is not a directory", "NOT_A_DIRECTORY"
        )
    if code == errno.EISDIR:
        return precondition(f"{what} is a directory", "IS_A_DIRECTORY")
    if code in (errno.EEXIST, errno.ENOTEMPTY):
        return precondition(f"{what} already exists", "FILE_EXISTS")
    if code == errno.ELOOP:
        return escape(
            f"{what}: refused to follow a symbolic link here (or too many levels of links)"
        )
    if code == errno.ENAMETOOLONG:
        return invalid(f"{what}: file name too long")
    if code in (errno.ENOSPC, errno.EDQUOT):
        return Refusal(
            grpc.StatusCode.RESOURCE_EXHAUSTED,
            "QUOTA_EXCEEDED",
            f"{what}: no space left on the disk",
            fault="task",
        )
    if code in (errno.EACCES, errno.EPERM):
        return Refusal(
            grpc.StatusCode.PERMISSION_DENIED,
            "ERROR_REASON_UNSPECIFIED",
            f"{what}: operation not permitted",
        )
    return Refusal(
        grpc.StatusCode.INTERNAL,
        "ERROR_REASON_UNSPECIFIED",
        f"{what}: {err.strerror or 'I/O error'} (errno {code})",
        fault="infrastructure",
    )


# ---- paths ---------------------------------------------------------------------


def clean_parts(
    path: str, what: str = "path", base: tuple[str, ...] = (), shown: str = "the sandbox root"
) -> tuple[str, ...]:
    """``path`` cleaned lexically on top of ``base``; climbing above ``base``'s top is refused."""
    if not path:
        raise invalid(f"{what} is empty")
    if "\0" in path:
        raise invalid(f"{what} {path!r} contains a NUL byte")
    if len(os.fsencode(path)) > MAX_PATH_BYTES:
        raise invalid(f"{what} is longer than {MAX_PATH_BYTES} bytes")
    stack = list(base)
    for part in path.split("/"):
        if part in ("", "."):
            continue
        if part == "..":
            if not stack:
                raise escape(f"{what} {path!r} climbs out of {shown}")
            stack.pop()
            continue
        stack.append(part)
    return tuple(stack)


def display(parts: tuple[str, ...]) -> str:
    return "/" + "/".join(parts)


def resolve(root: Path, parts: tuple[str, ...], *, follow_last: bool = True) -> Path:
    """The host path of sandbox path ``parts``, every symlink resolved inside ``root``."""
    done: list[str] = []
    todo = list(parts)
    links = 0
    while todo:
        name = todo.pop(0)
        if name in ("", "."):
            continue
        if name == "..":
            if done:
                done.pop()
            continue
        host = root.joinpath(*done, name)
        try:
            st = os.lstat(host)
        except FileNotFoundError:
            done.append(name)
            continue
        except OSError as err:
            raise fs_error(err, display((*done, name))) from err
        if stat.S_ISLNK(st.st_mode) and (todo or follow_last):
            links += 1
            if links > MAX_LINKS:
                raise fs_error(OSError(errno.ELOOP, "too many links"), display(parts))
            target = os.readlink(host)
            if target.startswith("/"):
                done = []
            todo = target.split("/") + todo
            continue
        done.append(name)
    return root.joinpath(*done)


def within(root: Path, host: Path) -> bool:
    return host == root or root in host.parents


def _make_dirs(root: Path, parts: tuple[str, ...]) -> Path:
    """``mkdir -p`` of a sandbox path, each prefix resolved in-root.

    A missing component is made in its resolved parent; a dangling symlink in
    the way is refused (FILE_EXISTS), never created through, as by the real
    executor (mkdirat does not follow links).
    """
    host = root
    for depth in range(1, len(parts) + 1):
        prefix = parts[:depth]
        host = resolve(root, prefix)
        if host.is_dir():
            continue
        entry = resolve(root, prefix[:-1]) / prefix[-1]
        if entry.is_symlink() or host.exists():
            raise precondition(
                f"cannot create directory {display(prefix)}: something that is not a directory "
                "(e.g. a dangling symlink) is in the way",
                "FILE_EXISTS",
            )
        try:
            os.mkdir(entry, 0o755)
        except FileExistsError:
            if not entry.is_dir():
                raise precondition(
                    f"cannot create directory {display(prefix)}: something is in the way",
                    "FILE_EXISTS",
                ) from None
        except OSError as err:
            raise fs_error(err, display(prefix)) from err
        host = entry
    return host


# ---- single files ------------------------------------------------------------------


def read_file(root: Path, path: str) -> Iterator[executor_pb2.FileChunk]:
    """FileInfo on the first chunk, then the data; bounded by the size seen at open."""
    parts = clean_parts(path)
    shown = display(parts)
    host = resolve(root, parts)
    try:
        fd = os.open(host, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as err:
        raise fs_error(err, shown) from err
    try:
        st = os.fstat(fd)
        if stat.S_ISDIR(st.st_mode):
            raise precondition(f"{shown} is a directory", "IS_A_DIRECTORY")
        if not stat.S_ISREG(st.st_mode):
            raise precondition(
                f"{shown} is not a regular file; only regular files can be transferred",
                "UNSUPPORTED_FILE_TYPE",
            )
        info = executor_pb2.FileInfo(size=st.st_size, mode=stat.S_IMODE(st.st_mode))
        remaining = st.st_size
        data = os.read(fd, min(CHUNK_SIZE, remaining)) if remaining else b""
        yield executor_pb2.FileChunk(info=info, data=data)
        remaining -= len(data)
        while remaining > 0 and data:
            data = os.read(fd, min(CHUNK_SIZE, remaining))
            if data:
                yield executor_pb2.FileChunk(data=data)
            remaining -= len(data)
    finally:
        os.close(fd)


def check_mode(mode: int) -> int:
    if mode == 0:
        return DEFAULT_FILE_MODE
    if mode & ~0o7777 and stat.S_IFMT(mode) != stat.S_IFREG:
        raise invalid(f"mode {mode:#o} is not a set of permission bits (0..0o7777)")
    return mode & 0o7777


def write_file(
    root: Path, path: str, mode: int, make_parents: bool, chunks: Iterable[bytes]
) -> int:
    """Write atomically (temp file + rename; a symlink at ``path`` is replaced, not followed)."""
    parts = clean_parts(path)
    if not parts:
        raise precondition("/ is a directory", "IS_A_DIRECTORY")
    file_mode = check_mode(mode)
    shown = display(parts)
    parent = _make_dirs(root, parts[:-1]) if make_parents else resolve(root, parts[:-1])
    if not parent.exists():
        raise not_found(f"{display(parts[:-1])} does not exist", "PATH_NOT_FOUND")
    if not parent.is_dir():
        raise precondition(
            f"{shown}: a component of the path is not a directory", "NOT_A_DIRECTORY"
        )
    target = parent / parts[-1]
    if target.is_dir() and not target.is_symlink():
        raise precondition(f"{shown} is a directory", "IS_A_DIRECTORY")
    tmp = parent / f".orchard-write-{secrets.token_hex(8)}.tmp"
    size = 0
    try:
        fd = os.open(
            tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600
        )
        try:
            for chunk in chunks:
                os.write(fd, chunk)
                size += len(chunk)
            os.fchmod(fd, file_mode)
        finally:
            os.close(fd)
        os.replace(tmp, target)
    except OSError as err:
        raise fs_error(err, shown) from err
    finally:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
    return size


def seed_files(root: Path, files: Mapping[str, bytes | str]) -> None:
    """Place an image's files in a new sandbox's root."""
    for path, content in files.items():
        data = content.encode() if isinstance(content, str) else content
        write_file(root, path, 0, True, [data])


# ---- tar streams -----------------------------------------------------------------------


class _ChunkReader(io.RawIOBase):
    """A readable file over an iterator of byte chunks (what tarfile's stream mode reads)."""

    def __init__(self, chunks: Iterable[bytes]) -> None:
        self._chunks = iter(chunks)
        self._buffer = b""
        self.started = False

    def readable(self) -> bool:
        return True

    def readinto(self, target: bytearray | memoryview) -> int:  # type: ignore[override]
        while not self._buffer:
            chunk = next(self._chunks, None)
            if chunk is None:
                return 0
            self._buffer = chunk
            self.started = self.started or bool(chunk)
        n = min(len(target), len(self._buffer))
        target[:n] = self._buffer[:n]
        self._buffer = self._buffer[n:]
        return n


def _member_parts(name: str, dest: str) -> tuple[str, ...]:
    if name.startswith("/"):
        raise escape(f"tar member {name!r} has an absolute path (unpacking into {dest})")
    return clean_parts(name, "tar member", shown=f"the upload destination {dest}")


def _place_parent(root: Path, dest: tuple[str, ...], parts: tuple[str, ...], name: str) -> Path:
    """The host directory a member goes in, made if missing.

    Below the destination a symlink is followed only while it stays below it;
    an absolute one or one leading out is PATH_ESCAPE (the real executor looks
    members up with openat2 ``RESOLVE_BENEATH`` from the destination).
    """
    dest_host = resolve(root, dest)
    here = dest_host
    for depth, part in enumerate(parts[:-1], 1):
        entry = here / part
        if entry.is_symlink():
            target = os.readlink(entry)
            resolved = resolve(root, dest + parts[:depth])
            if target.startswith("/") or not within(dest_host, resolved):
                raise escape(
                    f"tar member {name!r} goes through the symlink {display(dest + parts[:depth])} "
                    f"-> {target!r}, which leaves the upload destination {display(dest)}"
                )
    parent = _make_dirs(root, dest + parts[:-1])
    if not within(dest_host, parent):
        raise escape(f"tar member {name!r} resolves outside the upload destination {display(dest)}")
    return parent


def _clear(target: Path, name: str) -> None:
    """Unlink a non-directory in the way of a member (never write through it)."""
    if target.is_symlink() or (target.exists() and not target.is_dir()):
        target.unlink()
    elif target.is_dir():
        raise precondition(
            f"tar member {name!r}: a directory is in the way of a non-directory", "IS_A_DIRECTORY"
        )


def upload(root: Path, dest: str, chunks: Iterable[bytes]) -> tuple[int, int]:
    """Unpack a tar stream (plain, gzip, bzip2 or xz) into ``dest``; (files, bytes)."""
    dest_parts = clean_parts(dest, "upload destination")
    shown = display(dest_parts)
    _make_dirs(root, dest_parts)
    reader = _ChunkReader(chunks)
    stream = io.BufferedReader(reader, CHUNK_SIZE)
    if not stream.peek(1):
        return 0, 0
    files = size = 0
    try:
        with tarfile.open(fileobj=stream, mode="r|*") as tar:
            for member in tar:
                parts = _member_parts(member.name, shown)
                if not parts:
                    if member.isdir():
                        continue
                    raise precondition(f"{shown} is a directory", "IS_A_DIRECTORY")
                if member.isdir():
                    _make_dirs(root, dest_parts + parts)
                    continue
                if member.isfile():
                    parent = _place_parent(root, dest_parts, parts, member.name)
                    target = parent / parts[-1]
                    _clear(target, member.name)
                    source = tar.extractfile(member)
                    assert source is not None
                    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
                    fd = os.open(target, flags, 0o600)
                    try:
                        while data := source.read(CHUNK_SIZE):
                            os.write(fd, data)
                        os.fchmod(fd, member.mode & 0o7777)
                    finally:
                        os.close(fd)
                    os.utime(target, (member.mtime, member.mtime), follow_symlinks=False)
                    files += 1
                    size += member.size
                elif member.issym():
                    link = member.linkname
                    if not link or link.startswith("/"):
                        raise escape(
                            f"tar member {member.name!r} is a symlink to {link!r}; only relative "
                            f"symlinks inside {shown} are accepted"
                        )
                    clean_parts(
                        link, "symlink target", base=parts[:-1], shown=f"the destination {shown}"
                    )
                    parent = _place_parent(root, dest_parts, parts, member.name)
                    target = parent / parts[-1]
                    _clear(target, member.name)
                    os.symlink(link, target)
                    files += 1
                elif member.islnk():
                    source_parts = _member_parts(member.linkname, shown)
                    source_host = resolve(root, dest_parts + source_parts, follow_last=False)
                    if not within(resolve(root, dest_parts), source_host):
                        raise escape(f"tar member {member.name!r} links outside {shown}")
                    parent = _place_parent(root, dest_parts, parts, member.name)
                    target = parent / parts[-1]
                    _clear(target, member.name)
                    try:
                        os.link(source_host, target, follow_symlinks=False)
                    except FileNotFoundError:
                        raise not_found(
                            f"tar member {member.name!r} is a hard link to {member.linkname!r}, "
                            "which does not exist",
                            "PATH_NOT_FOUND",
                        ) from None
                    files += 1
                else:
                    raise precondition(
                        f"tar member {member.name!r} is not a file, directory or link; "
                        "only those can be uploaded",
                        "UNSUPPORTED_FILE_TYPE",
                    )
    except tarfile.TarError as err:
        raise invalid(f"malformed tar stream: {err}") from err
    except OSError as err:
        raise fs_error(err, shown) from err
    return files, size


class _ChunkSink(io.RawIOBase):
    def __init__(self) -> None:
        self.pending = bytearray()

    def writable(self) -> bool:
        return True

    def write(self, data: bytes | bytearray | memoryview) -> int:  # type: ignore[override]
        self.pending += data
        return len(data)

    def take(self) -> Iterator[bytes]:
        while len(self.pending) >= CHUNK_SIZE:
            yield bytes(self.pending[:CHUNK_SIZE])
            del self.pending[:CHUNK_SIZE]


def _keep_plain(info: tarfile.TarInfo) -> tarfile.TarInfo | None:
    """Files, directories and links only (fifos, sockets, devices are skipped, as by the real one)."""
    return info if info.isfile() or info.isdir() or info.issym() or info.islnk() else None


def download(root: Path, path: str) -> Iterator[bytes]:
    """A tar of the file or tree at ``path`` (members named after its last component).

    Nothing below ``path`` is followed: symlinks are stored as symlinks. One
    file at a time is held in memory (the real executor streams each file).
    """
    parts = clean_parts(path)
    shown = display(parts)
    host = resolve(root, parts)
    try:
        st = os.stat(host, follow_symlinks=False)
    except OSError as err:
        raise fs_error(err, shown) from err
    if not (stat.S_ISREG(st.st_mode) or stat.S_ISDIR(st.st_mode)):
        raise precondition(f"{shown} is not a regular file or directory", "UNSUPPORTED_FILE_TYPE")
    top = parts[-1] if parts else "."
    sink = _ChunkSink()
    with tarfile.open(fileobj=sink, mode="w|", format=tarfile.PAX_FORMAT) as tar:
        if stat.S_ISREG(st.st_mode):
            tar.add(host, arcname=top, recursive=False)
        else:
            for here, dirs, names in os.walk(host, followlinks=False):
                rel = os.path.relpath(here, host)
                prefix = top if rel == "." else f"{top}/{rel}"
                tar.add(here, arcname=prefix, recursive=False, filter=_keep_plain)
                yield from sink.take()
                for name in sorted(names) + sorted(
                    d for d in dirs if os.path.islink(os.path.join(here, d))
                ):
                    tar.add(
                        os.path.join(here, name),
                        arcname=f"{prefix}/{name}",
                        recursive=False,
                        filter=_keep_plain,
                    )
                    yield from sink.take()
                dirs[:] = sorted(d for d in dirs if not os.path.islink(os.path.join(here, d)))
    yield from sink.take()
    if sink.pending:
        yield bytes(sink.pending)
