"""Tar streams for upload and download, without holding a tree in memory.

Upload: :func:`tar_stream` walks a local directory and yields a tar stream in
chunks of at most ``CHUNK_BYTES`` (headers packed directly, many small files
per chunk: ``_tar_write``). Nothing bigger than one chunk is held.

Download: :func:`extract_stream` reads a tar stream from an iterator of chunks
and extracts member by member (``_tar_read``, the rules of ``tarfile``'s
``data`` filter); a member that would escape the target (absolute path,
``..``, a folder leading outside, a device node) raises
:class:`PathEscapeError` instead of being written, and links pointing outside
are not created.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from . import _tar_read, _tar_write
from ._errors import PathNotFoundError
from ._requests import CHUNK_BYTES

_BLOCK = 512


@dataclass(frozen=True)
class DownloadResult:
    """What :meth:`Sandbox.download` wrote into the local folder."""

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
    """The contents of ``local_dir`` (not the folder itself) as tar members, in chunks."""
    root = checked_local_dir(local_dir)
    yield from _tar_write.tar_members(os.fspath(root), CHUNK_BYTES)


def end_of_archive() -> bytes:
    return b"\0" * (2 * _BLOCK)


def tar_stream(local_dir: str | os.PathLike[str]) -> Iterator[bytes]:
    """A complete archive: members then the end-of-archive blocks."""
    yield from tar_chunks(local_dir)
    yield end_of_archive()


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
    count, skipped = _tar_read.extract(chunks, os.fspath(local_dir))
    return DownloadResult(count, tuple(skipped))
