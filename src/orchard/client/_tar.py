"""Tar streams for upload and download, without holding a tree in memory.

Upload: :func:`tar_chunks` walks a local directory and yields a tar stream in
pieces: each member's header (built by ``tarfile``), then its data read in
chunks, then padding. Nothing bigger than one chunk is ever held.

Download: :func:`extract_stream` reads a tar stream from an iterator of chunks
(``tarfile`` in stream mode, ``r|``) and extracts member by member with the
``data`` filter; a member that would escape the target (absolute path, ``..``,
a link pointing outside, a device node) raises :class:`PathEscapeError` instead
of being written.
"""

from __future__ import annotations

import io
import os
import tarfile
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from ._errors import InvalidRequestError, PathEscapeError, PathNotFoundError
from ._requests import CHUNK_BYTES

_BLOCK = tarfile.BLOCKSIZE


@dataclass(frozen=True)
class DownloadResult:
    members: int
    """Files, directories and links written."""
    skipped_links: tuple[str, ...] = ()
    """Links not created because they point outside the target folder."""


def checked_local_dir(local_dir: str | os.PathLike[str]) -> Path:
    root = Path(local_dir)
    if not root.is_dir():
        raise PathNotFoundError(f"{root} is not a local directory")
    return root


def tar_chunks(local_dir: str | os.PathLike[str]) -> Iterator[bytes]:
    """The contents of ``local_dir`` (not the folder itself) as a tar stream."""
    root = checked_local_dir(local_dir)
    # Used only for gettarinfo (stat -> TarInfo); nothing is written to it.
    with tarfile.open(fileobj=io.BytesIO(), mode="w", dereference=False) as archive:
        for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
            dirnames.sort()
            for name in [*sorted(dirnames), *sorted(filenames)]:
                full = os.path.join(dirpath, name)
                arcname = os.path.relpath(full, root)
                info = archive.gettarinfo(full, arcname)
                if info is None or not (info.isreg() or info.isdir() or info.issym()):
                    continue  # sockets, fifos, devices: not copied
                yield info.tobuf(
                    format=tarfile.PAX_FORMAT, encoding="utf-8", errors="surrogateescape"
                )
                if info.isreg():
                    yield from _file_data(full, info.size)


def end_of_archive() -> bytes:
    return b"\0" * (2 * _BLOCK)


def _file_data(path: str, size: int) -> Iterator[bytes]:
    sent = 0
    with open(path, "rb") as f:
        while sent < size:
            chunk = f.read(min(CHUNK_BYTES, size - sent))
            if not chunk:  # the file shrank while we read it: pad with zeros
                chunk = b"\0" * min(CHUNK_BYTES, size - sent)
            sent += len(chunk)
            yield chunk
    remainder = size % _BLOCK
    if remainder:
        yield b"\0" * (_BLOCK - remainder)


def tar_stream(local_dir: str | os.PathLike[str]) -> Iterator[bytes]:
    """A complete archive: members then the end-of-archive blocks."""
    yield from tar_chunks(local_dir)
    yield end_of_archive()


class ChunkReader:
    """A read-only file object over an iterator of byte chunks (what tarfile ``r|`` reads)."""

    def __init__(self, chunks: Iterable[bytes]) -> None:
        self._chunks = iter(chunks)
        self._buffer = b""
        self._done = False

    def read(self, size: int = -1) -> bytes:
        while not self._done and (size < 0 or len(self._buffer) < size):
            try:
                self._buffer += next(self._chunks)
            except StopIteration:
                self._done = True
        if size < 0:
            out, self._buffer = self._buffer, b""
        else:
            out, self._buffer = self._buffer[:size], self._buffer[size:]
        return out


def _strip_top(member: tarfile.TarInfo, top: str) -> bool:
    """Rename ``member`` from ``top/x`` to ``x``; False if it is not under ``top``."""
    prefix = "" if top in ("", ".") else top + "/"
    name = member.name.removeprefix("./") if top in ("", ".") else member.name
    if prefix and not name.startswith(prefix):
        return False
    member.name = name[len(prefix) :]
    if member.islnk() and member.linkname.startswith(prefix):
        member.linkname = member.linkname[len(prefix) :]
    return bool(member.name)


def extract_stream(chunks: Iterable[bytes], local_dir: str | os.PathLike[str]) -> DownloadResult:
    """Extract a Download tar stream into ``local_dir`` safely.

    Names that would leave ``local_dir`` (absolute, ``..``) raise
    :class:`PathEscapeError`. Links whose target lies outside ``local_dir``
    (common: ``/etc`` is full of absolute symlinks) are not created, since a
    later member could write through them; they are listed in the result.

    The executor names members after the downloaded path's last component
    (``/work`` -> ``work/``, ``work/a.py``). For a directory that top level is
    dropped, so the directory's *contents* land in ``local_dir`` (the mirror
    of :func:`tar_stream` on upload); a single file lands as ``local_dir/<name>``.
    """
    dest = Path(local_dir)
    dest.mkdir(parents=True, exist_ok=True)
    count = 0
    skipped: list[str] = []
    top: str | None = None
    try:
        with tarfile.open(fileobj=ChunkReader(chunks), mode="r|") as archive:  # type: ignore[call-overload]
            for member in archive:
                if top is None and member.isdir():
                    top = member.name.rstrip("/") or "."
                    continue
                if member.name.startswith("/"):
                    raise PathEscapeError(f"refused archive member {member.name!r}: absolute path")
                if top is not None and not _strip_top(member, top):
                    raise PathEscapeError(
                        f"refused archive member {member.name!r}: outside {top!r}"
                    )
                try:
                    archive.extract(member, dest, filter="data")
                except (tarfile.AbsoluteLinkError, tarfile.LinkOutsideDestinationError):
                    skipped.append(member.name)
                    continue
                except tarfile.FilterError as exc:
                    raise PathEscapeError(
                        f"refused archive member {member.name!r}: {exc}"
                    ) from None
                count += 1
    except tarfile.ReadError as exc:
        raise InvalidRequestError(f"the server sent a malformed tar stream: {exc}") from None
    return DownloadResult(count, tuple(skipped))
