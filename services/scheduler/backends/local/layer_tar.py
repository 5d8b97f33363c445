"""Unpack one image layer tar into its own folder, the way overlayfs wants it.

Image layers (``docker save``, OCI) mark deletions with AUFS-style whiteouts:
``.wh.<name>`` hides ``<name>`` of the layers below, ``.wh..wh..opq`` hides
everything below in its folder. Each layer stays its own overlayfs lower dir
(so layers stay shared), which means translating those markers into what
overlayfs reads: a ``.wh.<name>`` becomes a character device 0/0 named
``<name>``, and ``.wh..wh..opq`` becomes the ``trusted.overlay.opaque=y``
xattr on its folder.

A layer comes from outside, so nothing in it may write outside its folder:
absolute names and ``..`` are refused, every folder on the way to a member is
opened with ``O_NOFOLLOW`` from the layer's root (a symlink planted by an
earlier member is never followed, whatever it points at), and hard links must
name a file inside the same layer. Symlink *targets* are stored as they are:
they are only ever resolved inside the container's own root. Device nodes
are skipped (sandboxes cannot use them: no CAP_MKNOD, devices cgroup).
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import tarfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Protocol, cast

from ..base import BackendError

WHITEOUT_PREFIX = ".wh."
OPAQUE_MARKER = ".wh..wh..opq"
OPAQUE_XATTR = "trusted.overlay.opaque"
PAX_XATTR_PREFIX = "SCHILY.xattr."
# xattrs an image may carry; trusted.* (overlayfs' own markers) never.
ALLOWED_XATTR_PREFIXES = ("user.", "security.capability")
DIR_OPEN_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
COPY_CHUNK = 1 << 20


class LayerError(BackendError):
    """A layer tar that is malformed or tries to write outside its folder."""

    def __init__(self, message: str) -> None:
        super().__init__("INVALID_IMAGE", message, client_fault=True)


def member_parts(name: str) -> list[str]:
    """The path components of a member name, refusing anything that leaves the layer."""
    if name.startswith("/"):
        raise LayerError(f"absolute path in layer: {name!r}")
    parts = [part for part in name.split("/") if part not in ("", ".")]
    if ".." in parts:
        raise LayerError(f"'..' in layer path: {name!r}")
    if "\0" in name:
        raise LayerError(f"NUL in layer path: {name!r}")
    return parts


@dataclass
class _DirAttrs:
    parts: list[str]
    mode: int
    uid: int
    gid: int
    mtime: float


@dataclass
class LayerStats:
    files: int = 0
    whiteouts: int = 0
    opaque_dirs: int = 0
    skipped_devices: int = 0
    entries: int = 0
    file_bytes: int = 0
    """The regular files' sizes as the tar declares them (a sparse member's full size)."""


@dataclass(frozen=True)
class LayerLimits:
    """How far one layer may expand on the node's disk (None: no bound).

    A compressed blob says nothing of its unpacked size: a few MB of gzip can hold many GB of
    zeros (a decompression bomb), a sparse member declares a size its tar bytes never carry,
    and a tar of millions of empty members eats inodes. ``max_bytes`` bounds the sum of the
    regular files' declared sizes (checked before each file is written), ``max_entries`` the
    number of members.
    """

    max_bytes: int | None = None
    max_entries: int | None = None


class LayerTooLargeError(BackendError):
    """A layer that would expand beyond its :class:`LayerLimits`."""

    def __init__(self, message: str) -> None:
        super().__init__("LAYER_TOO_LARGE", message, client_fault=True)


class LayerWriter:
    """Writes the members of one layer tar below ``root`` (an existing empty folder)."""

    def __init__(self, root: Path, limits: LayerLimits | None = None) -> None:
        self.root = root
        self.limits = limits or LayerLimits()
        self.stats = LayerStats()
        self._dirs: list[_DirAttrs] = []

    def apply(self, tar: tarfile.TarFile) -> LayerStats:
        root_fd = os.open(self.root, DIR_OPEN_FLAGS)
        try:
            for member in tar:
                self.stats.entries += 1
                cap = self.limits.max_entries
                if cap is not None and self.stats.entries > cap:
                    raise LayerTooLargeError(f"the layer has more than {cap} members")
                self._apply_member(root_fd, tar, member)
            self._finish_dirs(root_fd)
        finally:
            os.close(root_fd)
        return self.stats

    # -- one member ------------------------------------------------------------

    def _apply_member(self, root_fd: int, tar: tarfile.TarFile, member: tarfile.TarInfo) -> None:
        parts = member_parts(member.name)
        if not parts:
            if member.isdir():
                return  # the layer root itself ("./")
            raise LayerError(f"layer member without a name: {member.name!r}")
        *dirs, base = parts
        with self._open_dir(root_fd, dirs, create=True) as parent:
            if base == OPAQUE_MARKER:
                os.setxattr(parent, OPAQUE_XATTR, b"y")
                self.stats.opaque_dirs += 1
            elif base.startswith(WHITEOUT_PREFIX):
                hidden = base[len(WHITEOUT_PREFIX) :]
                if not hidden or hidden in (".", ".."):
                    raise LayerError(f"bad whiteout {member.name!r}")
                _remove(parent, hidden)
                os.mknod(hidden, stat.S_IFCHR | 0o000, os.makedev(0, 0), dir_fd=parent)
                self.stats.whiteouts += 1
            elif member.isdir():
                self._make_dir(parent, base)
                self._dirs.append(
                    _DirAttrs(parts, member.mode, member.uid, member.gid, member.mtime)
                )
            elif member.isreg():
                self._write_file(parent, base, tar, member)
            elif member.issym():
                _remove(parent, base)
                os.symlink(member.linkname, base, dir_fd=parent)
                self._set_owner_times(parent, base, member, is_link=True)
            elif member.islnk():
                self._hard_link(root_fd, parent, base, member)
            elif member.isfifo():
                _remove(parent, base)
                os.mkfifo(base, member.mode & 0o7777, dir_fd=parent)
                self._set_owner_times(parent, base, member)
            elif member.ischr() or member.isblk():
                self.stats.skipped_devices += 1
            else:
                raise LayerError(f"unsupported tar member type {member.type!r}: {member.name!r}")

    def _write_file(
        self, parent: int, base: str, tar: tarfile.TarFile, member: tarfile.TarInfo
    ) -> None:
        self.stats.file_bytes += member.size
        cap = self.limits.max_bytes
        if cap is not None and self.stats.file_bytes > cap:
            raise LayerTooLargeError(
                f"the layer's files expand beyond {cap} bytes (at {member.name!r}, "
                f"{self.stats.file_bytes} bytes so far)"
            )
        _remove(parent, base)
        source = tar.extractfile(member)
        if source is None:
            raise LayerError(f"cannot read {member.name!r}")
        fd = os.open(
            base,
            os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
            0o600,
            dir_fd=parent,
        )
        try:
            with source:
                _copy_to_fd(source, fd)
            os.fchown(fd, member.uid, member.gid)
            os.fchmod(fd, member.mode & 0o7777)  # after chown, which drops setuid bits
            _set_xattrs(fd, member)
            os.utime(fd, (member.mtime, member.mtime))
        finally:
            os.close(fd)
        self.stats.files += 1

    def _hard_link(self, root_fd: int, parent: int, base: str, member: tarfile.TarInfo) -> None:
        target = member_parts(member.linkname)
        if not target:
            raise LayerError(f"hard link to the layer root: {member.name!r}")
        *target_dirs, target_base = target
        with self._open_dir(root_fd, target_dirs, create=False) as target_parent:
            try:
                st = os.stat(target_base, dir_fd=target_parent, follow_symlinks=False)
            except FileNotFoundError:
                raise LayerError(
                    f"hard link {member.name!r} to {member.linkname!r}, not in this layer"
                ) from None
            if stat.S_ISDIR(st.st_mode):
                raise LayerError(f"hard link to a folder: {member.name!r}")
            _remove(parent, base)
            os.link(
                target_base,
                base,
                src_dir_fd=target_parent,
                dst_dir_fd=parent,
                follow_symlinks=False,
            )

    def _make_dir(self, parent: int, base: str) -> None:
        try:
            st = os.stat(base, dir_fd=parent, follow_symlinks=False)
        except FileNotFoundError:
            os.mkdir(base, 0o755, dir_fd=parent)
            return
        if not stat.S_ISDIR(st.st_mode):
            _remove(parent, base)
            os.mkdir(base, 0o755, dir_fd=parent)

    @contextlib.contextmanager
    def _open_dir(self, root_fd: int, dirs: list[str], *, create: bool) -> Iterator[int]:
        """An fd of the folder ``dirs`` below the root, never following a symlink."""
        fd = os.dup(root_fd)
        try:
            for name in dirs:
                try:
                    next_fd = os.open(name, DIR_OPEN_FLAGS, dir_fd=fd)
                except FileNotFoundError:
                    if not create:
                        raise LayerError(f"path {'/'.join(dirs)!r} is not in this layer") from None
                    os.mkdir(name, 0o755, dir_fd=fd)
                    next_fd = os.open(name, DIR_OPEN_FLAGS, dir_fd=fd)
                except OSError as err:
                    if err.errno in (errno.ELOOP, errno.ENOTDIR):
                        raise LayerError(
                            f"layer path {'/'.join(dirs)!r} goes through a symlink or a file"
                        ) from None
                    raise
                os.close(fd)
                fd = next_fd
            yield fd
        finally:
            os.close(fd)

    def _set_owner_times(
        self, parent: int, base: str, member: tarfile.TarInfo, *, is_link: bool = False
    ) -> None:
        os.chown(base, member.uid, member.gid, dir_fd=parent, follow_symlinks=False)
        if not is_link:
            os.chmod(base, member.mode & 0o7777, dir_fd=parent)
        os.utime(base, (member.mtime, member.mtime), dir_fd=parent, follow_symlinks=False)

    def _finish_dirs(self, root_fd: int) -> None:
        # Deepest first, so setting a folder's mtime is not undone by its children.
        for attrs in sorted(self._dirs, key=lambda d: len(d.parts), reverse=True):
            with self._open_dir(root_fd, attrs.parts, create=False) as fd:
                os.fchown(fd, attrs.uid, attrs.gid)
                os.fchmod(fd, attrs.mode & 0o7777)
                os.utime(fd, (attrs.mtime, attrs.mtime))


class Readable(Protocol):
    def read(self, size: int = -1, /) -> bytes: ...


def apply_layer(stream: Readable, dest: Path, limits: LayerLimits | None = None) -> LayerStats:
    """Unpack the layer tar read from ``stream`` (plain, gzip, bzip2 or xz) into ``dest``."""
    try:
        # Stream mode only ever calls read(), which is all a Readable has.
        with tarfile.open(fileobj=cast(IO[bytes], stream), mode="r|*") as tar:
            return LayerWriter(dest, limits).apply(tar)
    except tarfile.TarError as err:
        raise LayerError(f"bad layer tar: {err}") from err


def _copy_to_fd(source: IO[bytes], fd: int) -> None:
    while chunk := source.read(COPY_CHUNK):
        view = memoryview(chunk)
        while view:
            written = os.write(fd, view)
            view = view[written:]


def _remove(parent: int, name: str) -> None:
    """Remove whatever is at ``name`` (a later member replaces an earlier one)."""
    try:
        st = os.stat(name, dir_fd=parent, follow_symlinks=False)
    except FileNotFoundError:
        return
    if stat.S_ISDIR(st.st_mode):
        fd = os.open(name, DIR_OPEN_FLAGS, dir_fd=parent)
        try:
            with os.scandir(fd) as entries:
                children = [entry.name for entry in entries]
            for child in children:
                _remove(fd, child)
        finally:
            os.close(fd)
        os.rmdir(name, dir_fd=parent)
    else:
        os.unlink(name, dir_fd=parent)


def _set_xattrs(fd: int, member: tarfile.TarInfo) -> None:
    for key, value in member.pax_headers.items():
        if not key.startswith(PAX_XATTR_PREFIX):
            continue
        attr = key[len(PAX_XATTR_PREFIX) :]
        if attr.startswith(ALLOWED_XATTR_PREFIXES):
            os.setxattr(fd, attr, value.encode("utf-8", "surrogateescape"))
