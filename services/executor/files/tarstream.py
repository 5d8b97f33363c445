"""Upload (unpack a tar stream into the sandbox) and Download (tar a tree out).

Upload confinement. The destination directory is resolved in-root (symlinks
followed as the sandbox sees them) and created if missing; from then on every
member is placed relative to an fd of that destination:

* names are cleaned lexically; absolute names and names climbing out of the
  destination are refused (PATH_ESCAPE);
* a member's parent directory is looked up with ``RESOLVE_BENEATH`` from the
  destination fd: a symlink on the way (planted by an earlier member or
  already in the sandbox) is followed only while it stays below the
  destination; an absolute or escaping one fails the lookup (EXDEV ->
  PATH_ESCAPE), so nothing can redirect a later member elsewhere;
* the last component is made with calls that never follow it:
  ``O_CREAT|O_EXCL|O_NOFOLLOW`` files, mkdirat, symlinkat, linkat without
  AT_SYMLINK_FOLLOW, unlinkat. An existing file, symlink or hard link at that
  name is unlinked and replaced (never written through); an existing
  directory is kept for a directory member (even if it is a symlink to a
  directory below the destination) and refused for anything else;
* symlink members must be relative and stay inside the destination; hard
  link targets must name a path inside the destination; device and fifo
  members are refused (UNSUPPORTED_FILE_TYPE);
* sizes in headers are not trusted: data is copied in bounded chunks and a
  stream that ends early is an error; PAX/GNU long-name headers are capped;
  the stream may be gzip, bzip2 or xz (decompressed with bounded output).

Files and symlinks belong to the sandbox's root, or to the upload's named
owner (``UploadHeader.owner``); member uid/gid are not applied. Modes (``& 0o7777``) and mtimes are. Directory mtimes are applied at
the end (children change them), for up to ``MAX_DIR_TIMES`` directories. An
Upload is not a transaction: on error, members already unpacked stay, but a
file whose data was being copied is removed.

Download: see :func:`download`.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable
from functools import partial
from pathlib import Path

from orchard.common import tarheader
from orchard.common.errors import ServiceError, not_found, precondition

from .bridge import ChunkSource, feed_thread, stream_from_thread
from .confined import O_PATH, O_READ, ConfinedRoot, close_quietly, reopen
from .decompress import open_decoded
from .fserrors import (
    FILE_EXISTS,
    IS_A_DIRECTORY,
    NOT_A_DIRECTORY,
    PATH_NOT_FOUND,
    UNSUPPORTED_FILE_TYPE,
    fs_error,
    unsupported_type,
)
from .openat2 import RESOLVE_NO_SYMLINKS, openat2
from .paths import SandboxPath, check_link_target, parse_member_name, parse_sandbox_path
from .tarreader import BLOCKDEV, CHARDEV, DIRECTORY, FIFO, HARDLINK, SYMLINK, TarMember, TarReader
from .transfer import CHUNK_SIZE, write_all

MAX_DIR_TIMES = 65536
_PARENT_CACHE = 32
_CREATE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


def _read_umask() -> int:
    """The process umask, without the set-and-restore race of os.umask."""
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    return 0o7777  # unknown: always fchmod


# Files are created with their final mode; fchmod only when the umask would
# have stripped bits (saves a syscall per file in the common case).
_UMASK = _read_umask()
_DIR_PATH = O_PATH | os.O_DIRECTORY


# -- upload ----------------------------------------------------------------------


class _Unpacker:
    """Places members below one destination directory fd (see the module docstring)."""

    def __init__(self, confined: ConfinedRoot, dest_fd: int, dest: SandboxPath) -> None:
        self.dest_fd = dest_fd
        self.confined = confined
        self.dest = dest.display
        self.resolve = confined.resolve_beneath
        self.files = 0
        self.bytes = 0
        self._parents: OrderedDict[tuple[str, ...], int] = OrderedDict()
        self._dir_times: list[tuple[tuple[str, ...], int]] = []

    def close(self) -> None:
        for fd in self._parents.values():
            close_quietly(fd)
        self._parents.clear()

    def _shown(self, parts: tuple[str, ...]) -> str:
        return self.dest.rstrip("/") + "/" + "/".join(parts)

    # parents

    def parent_fd(self, parts: tuple[str, ...]) -> int:
        """An O_PATH fd on the directory ``parts`` below the destination, made if missing."""
        if not parts:
            return self.dest_fd
        fd = self._parents.get(parts)
        if fd is not None:
            self._parents.move_to_end(parts)
            return fd
        fd = self._lookup_dir(parts)
        self._parents[parts] = fd
        if len(self._parents) > _PARENT_CACHE:
            close_quietly(self._parents.popitem(last=False)[1])
        return fd

    def _lookup_dir(self, parts: tuple[str, ...]) -> int:
        try:
            return openat2(self.dest_fd, "/".join(parts), _DIR_PATH, 0, self.resolve)
        except OSError as err:
            if err.errno != errno.ENOENT:
                raise fs_error(err, self._shown(parts)) from err
        # Archives may omit directory entries ("a/b/f" without "a/"): make them.
        parent = self.parent_fd(parts[:-1])
        try:
            os.mkdir(parts[-1], 0o755, dir_fd=parent)
            self.confined.own(parts[-1], parent)
        except FileExistsError:
            pass
        except OSError as err:
            raise fs_error(err, self._shown(parts)) from err
        try:
            return openat2(self.dest_fd, "/".join(parts), _DIR_PATH, 0, self.resolve)
        except OSError as err:
            raise fs_error(err, self._shown(parts)) from err

    def _forget_below(self, parts: tuple[str, ...]) -> None:
        """Drop cached directory fds reached through ``parts``, which was just replaced.

        (A cached "a" may be a symlink "a -> sub" that a later member replaces.)
        """
        depth = len(parts)
        for key in [key for key in self._parents if key[:depth] == parts]:
            close_quietly(self._parents.pop(key))

    # members

    def add(self, member: TarMember, reader: TarReader) -> None:
        parts = parse_member_name(member.name, self.dest)
        kind = member.kind
        if member.is_regular:
            self._add_file(parts, member, reader)
        elif kind == DIRECTORY:
            self._add_dir(parts, member)
        elif kind == SYMLINK:
            self._add_symlink(parts, member)
        elif kind == HARDLINK:
            self._add_hardlink(parts, member)
        elif kind in (FIFO, CHARDEV, BLOCKDEV):
            what = "a fifo" if kind == FIFO else "a device node"
            raise precondition(
                f"tar member {member.name!r} is {what}; only files, directories and links "
                "can be uploaded",
                UNSUPPORTED_FILE_TYPE,
            )
        else:
            raise precondition(
                f"tar member {member.name!r} has unsupported type {kind!r} "
                "(sparse, multi-volume...)",
                UNSUPPORTED_FILE_TYPE,
            )

    def _add_dir(self, parts: tuple[str, ...], member: TarMember) -> None:
        if not parts:
            return  # "." / "./": the destination itself, which exists
        parent = self.parent_fd(parts[:-1])
        name = parts[-1]
        try:
            os.mkdir(name, 0o700, dir_fd=parent)
            self.confined.own(name, parent)
        except FileExistsError:
            st = os.stat(name, dir_fd=parent, follow_symlinks=False)
            if stat.S_ISLNK(st.st_mode):
                return  # kept; children resolve through it only if it stays below dest
            if not stat.S_ISDIR(st.st_mode):
                raise precondition(
                    f"{self._shown(parts)} exists and is not a directory", NOT_A_DIRECTORY
                ) from None
        except OSError as err:
            raise fs_error(err, self._shown(parts)) from err
        fd = self.parent_fd(parts)
        os.chmod(f"/proc/self/fd/{fd}", member.mode)
        if len(self._dir_times) < MAX_DIR_TIMES:
            self._dir_times.append((parts, int(member.mtime)))

    def _create(self, parent: int, name: str, parts: tuple[str, ...], mode: int) -> int:
        for _ in range(3):
            try:
                fd = os.open(name, _CREATE, mode, dir_fd=parent)
                if self.confined.owner or self.confined.group:
                    self.confined.own_fd(fd)
                    os.fchmod(fd, mode)  # fchown cleared any setuid bits
                return fd
            except FileExistsError:
                self._remove(parent, name, parts)
        raise precondition(f"{self._shown(parts)} keeps being recreated", FILE_EXISTS)

    def _remove(self, parent: int, name: str, parts: tuple[str, ...]) -> None:
        """Unlink a non-directory in the way of a member (never a directory)."""
        try:
            os.unlink(name, dir_fd=parent)
        except FileNotFoundError:
            pass
        except IsADirectoryError:
            raise precondition(
                f"{self._shown(parts)} is a directory and cannot be replaced by a non-directory",
                IS_A_DIRECTORY,
            ) from None
        self._forget_below(parts)

    def _add_file(self, parts: tuple[str, ...], member: TarMember, reader: TarReader) -> None:
        if not parts:
            raise precondition(f"{self.dest} is a directory", IS_A_DIRECTORY)
        parent = self.parent_fd(parts[:-1])
        name = parts[-1]
        fd = self._create(parent, name, parts, member.mode)
        try:
            for piece in reader.data():
                written = os.write(fd, piece)
                if written < len(piece):
                    write_all(fd, piece[written:])
            if member.mode & _UMASK:
                os.fchmod(fd, member.mode)
            mtime_ns = int(member.mtime * 1_000_000_000)
            os.utime(fd, ns=(mtime_ns, mtime_ns))
        except BaseException:
            close_quietly(fd)
            with contextlib.suppress(OSError):
                os.unlink(name, dir_fd=parent)
            raise
        os.close(fd)
        self.files += 1
        self.bytes += member.size

    def _add_symlink(self, parts: tuple[str, ...], member: TarMember) -> None:
        if not parts:
            raise precondition(f"{self.dest} is a directory", IS_A_DIRECTORY)
        check_link_target(member.linkname, parts, self.dest, member.name)
        parent = self.parent_fd(parts[:-1])
        name = parts[-1]
        for _ in range(3):
            try:
                os.symlink(member.linkname, name, dir_fd=parent)
                self.confined.own(name, parent)
                break
            except FileExistsError:
                self._remove(parent, name, parts)
        else:
            raise precondition(f"{self._shown(parts)} keeps being recreated", FILE_EXISTS)
        mtime_ns = int(member.mtime * 1_000_000_000)
        os.utime(name, ns=(mtime_ns, mtime_ns), dir_fd=parent, follow_symlinks=False)
        self.files += 1

    def _add_hardlink(self, parts: tuple[str, ...], member: TarMember) -> None:
        if not parts:
            raise precondition(f"{self.dest} is a directory", IS_A_DIRECTORY)
        try:
            target = parse_member_name(member.linkname, self.dest)
        except ServiceError as err:
            raise type(err)(
                err.code,
                err.reason,
                f"tar member {member.name!r} is a hard link to {member.linkname!r}, "
                f"outside {self.dest}",
            ) from err
        if not target:
            raise precondition(f"tar member {member.name!r} links to a directory", IS_A_DIRECTORY)
        src_parent = self.parent_fd(target[:-1])
        parent = self.parent_fd(parts[:-1])
        name = parts[-1]
        for _ in range(3):
            try:
                # follow_symlinks=False: linkat without AT_SYMLINK_FOLLOW.
                os.link(
                    target[-1],
                    name,
                    src_dir_fd=src_parent,
                    dst_dir_fd=parent,
                    follow_symlinks=False,
                )
                break
            except FileExistsError:
                self._remove(parent, name, parts)
                src_parent = self.parent_fd(target[:-1])
                parent = self.parent_fd(parts[:-1])
            except FileNotFoundError:
                raise not_found(
                    f"tar member {member.name!r} is a hard link to {member.linkname!r}, "
                    "which does not exist",
                    PATH_NOT_FOUND,
                ) from None
        else:
            raise precondition(f"{self._shown(parts)} keeps being recreated", FILE_EXISTS)
        self.files += 1

    def finish(self) -> None:
        """Apply directory mtimes, deepest first (setting them earlier is undone by children)."""
        for parts, mtime in reversed(self._dir_times):
            try:
                fd = openat2(
                    self.dest_fd,
                    "/".join(parts),
                    os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC,
                    0,
                    self.resolve | RESOLVE_NO_SYMLINKS,
                )
            except OSError:
                continue  # replaced meanwhile: nothing of ours to stamp
            try:
                os.utime(fd, ns=(mtime * 1_000_000_000, mtime * 1_000_000_000))
            finally:
                os.close(fd)


def _unpack(
    root: Path,
    dest: SandboxPath,
    same_mount: bool,
    owner: int,
    group: int | None,
    source: ChunkSource,
) -> tuple[int, int]:
    with ConfinedRoot.open(root, same_mount=same_mount, owner=owner, group=group) as confined:
        dest_fd = confined.open_dir(dest, create=True)
        unpacker = _Unpacker(confined, dest_fd, dest)
        try:
            stream = open_decoded(source)
            if stream is None:
                return 0, 0  # an empty upload: just the directory
            reader = TarReader(stream, CHUNK_SIZE)
            while (member := reader.next()) is not None:
                unpacker.add(member, reader)
            unpacker.finish()
            return unpacker.files, unpacker.bytes
        except OSError as err:
            raise fs_error(err, dest.display) from err
        finally:
            unpacker.close()
            os.close(dest_fd)


async def upload(
    root: Path,
    dest: str,
    data: AsyncIterator[bytes],
    *,
    same_mount: bool = True,
    owner: int = 0,
    group: int | None = None,
) -> tuple[int, int]:
    """Unpack the tar stream ``data`` into the directory ``dest``; return (files, bytes).

    ``owner`` / ``group``: host uid and gid given what the upload creates (the
    sandbox's root by default; a named owner from :mod:`.owners`).

    ``files`` counts regular files, symlinks and hard links created (not
    directories); ``bytes`` is the regular-file data written.
    """
    target = parse_sandbox_path(dest, "upload destination")
    return await feed_thread(data, partial(_unpack, root, target, same_mount, owner, group))


# -- download ------------------------------------------------------------------


class _TarWriter:
    """Packs members into ~CHUNK_SIZE chunks handed to ``send``."""

    def __init__(self, send: Callable[[bytes], None]) -> None:
        self._send = send
        self._buf = bytearray()

    def write(self, data: bytes) -> None:
        if not self._buf and len(data) >= CHUNK_SIZE:
            self._send(data)  # a whole chunk of file data: no copy
            return
        self._buf += data
        if len(self._buf) >= CHUNK_SIZE:
            self.flush()

    def flush(self) -> None:
        if self._buf:
            self._send(bytes(self._buf))
            self._buf.clear()

    def copy_file(self, fd: int, size: int) -> None:
        """Exactly ``size`` bytes of ``fd``: cut if it grew, zero-padded if it shrank."""
        remaining = size
        while remaining > 0:
            data = os.read(fd, min(CHUNK_SIZE, remaining))
            if not data:
                break
            self.write(data)
            remaining -= len(data)
        while remaining > 0:
            zeros = min(remaining, CHUNK_SIZE)
            self.write(bytes(zeros))
            remaining -= zeros
        pad = tarheader.padding(size)
        if pad:
            self.write(pad)


class _Packer:
    """Walks a tree below a directory fd without ever following a symlink."""

    def __init__(self, confined: ConfinedRoot, writer: _TarWriter) -> None:
        self.resolve = confined.resolve_beneath | RESOLVE_NO_SYMLINKS
        self.out = writer
        self._links: dict[tuple[int, int], str] = {}

    def add_file(self, name: str, fd: int, st: os.stat_result) -> None:
        """A regular file, from an fd already opened for reading."""
        if st.st_nlink > 1:
            key = (st.st_dev, st.st_ino)
            first = self._links.get(key)
            if first is not None:
                self.out.write(
                    tarheader.header(
                        name,
                        tarheader.LNKTYPE,
                        mode=st.st_mode,
                        uid=st.st_uid,
                        gid=st.st_gid,
                        mtime=int(st.st_mtime),
                        linkname=first,
                    )
                )
                return
            self._links[key] = name
        self.out.write(
            tarheader.header(
                name,
                tarheader.REGTYPE,
                mode=st.st_mode,
                uid=st.st_uid,
                gid=st.st_gid,
                size=st.st_size,
                mtime=int(st.st_mtime),
            )
        )
        self.out.copy_file(fd, st.st_size)

    def _entry_file(self, dir_fd: int, entry: os.DirEntry[str], name: str) -> None:
        try:
            pfd = os.open(entry.name, O_PATH | os.O_NOFOLLOW, dir_fd=dir_fd)
        except OSError:
            return  # vanished meanwhile
        try:
            st = os.fstat(pfd)
            if not stat.S_ISREG(st.st_mode):
                return  # swapped for something else: skip like any special file
            fd = reopen(pfd, O_READ)
        finally:
            os.close(pfd)
        try:
            self.add_file(name, fd, st)
        finally:
            os.close(fd)

    def _entry_symlink(self, dir_fd: int, entry: os.DirEntry[str], name: str) -> None:
        try:
            st = entry.stat(follow_symlinks=False)
            target = os.readlink(entry.name, dir_fd=dir_fd)
        except OSError:
            return
        self.out.write(
            tarheader.header(
                name,
                tarheader.SYMTYPE,
                mode=st.st_mode,
                uid=st.st_uid,
                gid=st.st_gid,
                mtime=int(st.st_mtime),
                linkname=target,
            )
        )

    def add_tree(self, top_fd: int, top_name: str) -> None:
        """The directory ``top_fd`` (opened for reading) and everything below it.

        Depth-first with an explicit stack and one directory fd open at a time:
        each subdirectory is reopened from ``top_fd`` with RESOLVE_BENEATH and
        RESOLVE_NO_SYMLINKS, so a directory swapped for a symlink meanwhile is
        skipped rather than followed, and deep trees cannot exhaust fds.
        """
        stack: list[tuple[str, tuple[str, ...]]] = [(top_name, ())]
        while stack:
            name, rel = stack.pop()
            if rel:
                try:
                    dir_fd = openat2(
                        top_fd,
                        "/".join(rel),
                        os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC,
                        0,
                        self.resolve,
                    )
                except OSError:
                    continue  # vanished, replaced by a symlink, or a mount point
            else:
                dir_fd = top_fd
            try:
                subdirs = self._add_dir(dir_fd, name, rel)
            finally:
                if dir_fd != top_fd:
                    os.close(dir_fd)
            stack.extend(reversed(subdirs))

    def _add_dir(
        self, dir_fd: int, name: str, rel: tuple[str, ...]
    ) -> list[tuple[str, tuple[str, ...]]]:
        st = os.fstat(dir_fd)
        self.out.write(
            tarheader.header(
                name + "/",
                tarheader.DIRTYPE,
                mode=st.st_mode,
                uid=st.st_uid,
                gid=st.st_gid,
                mtime=int(st.st_mtime),
            )
        )
        subdirs: list[tuple[str, tuple[str, ...]]] = []
        with os.scandir(dir_fd) as entries:
            for entry in entries:
                child = f"{name}/{entry.name}"
                try:
                    if entry.is_dir(follow_symlinks=False):
                        subdirs.append((child, (*rel, entry.name)))
                    elif entry.is_symlink():
                        self._entry_symlink(dir_fd, entry, child)
                    elif entry.is_file(follow_symlinks=False):
                        self._entry_file(dir_fd, entry, child)
                    # fifos, sockets and device nodes are skipped
                except FileNotFoundError:
                    continue
        return subdirs


def _pack(root: Path, path: SandboxPath, same_mount: bool, send: Callable[[bytes], None]) -> None:
    writer = _TarWriter(send)
    top_name = path.name or "."
    with ConfinedRoot.open(root, same_mount=same_mount) as confined:
        pfd, st = confined.stat_path(path)
        packer = _Packer(confined, writer)
        try:
            if stat.S_ISREG(st.st_mode) or stat.S_ISDIR(st.st_mode):
                fd = reopen(pfd, os.O_RDONLY | os.O_NONBLOCK)
            else:
                raise unsupported_type(path.display, st.st_mode)
        except OSError as err:
            raise fs_error(err, path.display) from err
        finally:
            os.close(pfd)
        try:
            if stat.S_ISREG(st.st_mode):
                packer.add_file(top_name, fd, os.fstat(fd))
            else:
                packer.add_tree(fd, top_name)
        except OSError as err:
            raise fs_error(err, path.display) from err
        finally:
            os.close(fd)
    writer.write(tarheader.END_OF_ARCHIVE)
    writer.flush()


async def download(root: Path, path: str, *, same_mount: bool = True) -> AsyncIterator[bytes]:
    """A tar stream of the file or directory ``path``, in ~1 MiB chunks.

    The requested path itself is resolved in-root (a symlink there is followed
    the way the sandbox would follow it); members are named after its last
    component (``/home/u/proj`` gives ``proj/``, ``proj/a.py``...; ``/`` gives
    ``./``). Below it nothing is followed: symlinks are stored as symlinks
    (their targets as they are, even absolute), hard links within the tree as
    hard links, and fifos, sockets and device nodes are skipped silently (a
    tar of them could not be uploaded anyway, and opening them could block or
    have side effects). Subdirectories on another mount are skipped too.
    Files that change while being read are cut or zero-padded to the size in
    their header, as GNU tar does.
    """
    target = parse_sandbox_path(path)
    async for chunk in stream_from_thread(partial(_pack, root, target, same_mount)):
        yield chunk
