"""Bounded, streaming decompression of an upload (gzip, bzip2, xz, or none).

tarfile's own ``r|gz`` decompresses each input block in one call with no
output limit: one 1 MiB chunk of a gzip bomb becomes ~1 GiB in the executor's
memory. Here every ``read(n)`` returns at most ``n`` decompressed bytes (the
decompressors' ``max_length``), so memory stays at a chunk or two whatever the
compression ratio; the archive itself is then parsed by :mod:`.tarreader`.
"""

from __future__ import annotations

import bz2
import lzma
import zlib
from typing import Protocol

from orchard.common.errors import invalid

from .fserrors import INVALID_FIELD


class Readable(Protocol):
    def read(self, size: int = -1, /) -> bytes: ...


class _Peeked:
    """A readable that first returns the bytes already taken off ``inner``."""

    def __init__(self, head: bytes, inner: Readable) -> None:
        self._head = head
        self._inner = inner

    def read(self, size: int = -1, /) -> bytes:
        if self._head:
            if 0 <= size < len(self._head):
                out, self._head = self._head[:size], self._head[size:]
                return out
            out, self._head = self._head, b""
            return out
        return self._inner.read(size)


class _ZlibStream:
    def __init__(self, inner: Readable) -> None:
        self._inner = inner
        self._decomp = zlib.decompressobj(wbits=31)  # gzip framing
        self._tail = b""

    def read(self, size: int = -1, /) -> bytes:
        limit = size if size > 0 else 1 << 20
        while not self._decomp.eof:
            data = self._tail or self._inner.read(1 << 20)
            if not data:
                raise invalid("the gzip stream is truncated", INVALID_FIELD)
            try:
                out = self._decomp.decompress(data, limit)
            except zlib.error as err:
                raise invalid(f"the gzip stream is corrupt: {err}", INVALID_FIELD) from err
            self._tail = self._decomp.unconsumed_tail
            if out:
                return out
        return b""


class _BufferedDecompressor(Protocol):
    @property
    def eof(self) -> bool: ...
    @property
    def needs_input(self) -> bool: ...

    def decompress(self, data: bytes, max_length: int = -1) -> bytes: ...


class _LibStream:
    """bz2 and xz: their decompressors keep unconsumed input internally."""

    def __init__(self, inner: Readable, decomp: _BufferedDecompressor, kind: str) -> None:
        self._inner = inner
        self._decomp = decomp
        self._kind = kind

    def read(self, size: int = -1, /) -> bytes:
        limit = size if size > 0 else 1 << 20
        while not self._decomp.eof:
            data = b""
            if self._decomp.needs_input:
                data = self._inner.read(1 << 20)
                if not data:
                    raise invalid(f"the {self._kind} stream is truncated", INVALID_FIELD)
            try:
                out = self._decomp.decompress(data, limit)
            except (OSError, lzma.LZMAError, EOFError) as err:
                raise invalid(f"the {self._kind} stream is corrupt: {err}", INVALID_FIELD) from err
            if out:
                return out
        return b""


def open_decoded(source: Readable) -> Readable | None:
    """A readable of the decompressed stream, or None if the stream is empty."""
    head = b""
    while len(head) < 6:
        more = source.read(6 - len(head))
        if not more:
            break
        head += more
    if not head:
        return None
    stream = _Peeked(head, source)
    if head.startswith(b"\x1f\x8b"):
        return _ZlibStream(stream)
    if head.startswith(b"BZh"):
        return _LibStream(stream, bz2.BZ2Decompressor(), "bzip2")
    if head.startswith(b"\xfd7zXZ\x00"):
        return _LibStream(stream, lzma.LZMADecompressor(), "xz")
    return stream
