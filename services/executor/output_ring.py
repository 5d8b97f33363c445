"""A background process's output: a bounded buffer with offsets, oldest bytes dropped.

A background process outlives every stream that reads it, so its output has
to wait somewhere for a reader that may come later (a new client, a
reconnect) or never. :class:`OutputRing` keeps the most recent ``capacity``
bytes of both streams, in the order they were read, each chunk tagged with
its offset in the process's whole output. When a chunk does not fit, the
oldest chunks are dropped first: the process never blocks on a reader, and a
reader that asks for bytes no longer kept is told how many it missed
(``dropped``) instead of silently getting a hole.

Every kept byte is also charged to the executor's output ledger
(:mod:`output_budget`, per sandbox / tenant / node): when the ledger has no
room (other calls of the same sandbox hold it), the ring drops its own
oldest bytes to make room, and if it holds none the new chunk is dropped.
So many processes of one hostile sandbox cannot grow the executor past the
sandbox's output share. Why drop and not refuse like a Run: the process is
meant to run on unattended (a server, a watcher); killing it for output
nobody reads would be worse than losing old log lines, as ``tail`` would.
"""

from __future__ import annotations

import asyncio
import collections
from dataclasses import dataclass

from .shares import Owner, ShareLedger

STDOUT = 1
STDERR = 2


@dataclass(frozen=True, slots=True)
class Chunk:
    offset: int
    """Offset of the chunk's first byte in the process's whole output."""
    stream: int
    data: bytes

    @property
    def end(self) -> int:
        return self.offset + len(self.data)


class OutputRing:
    """The last ``capacity`` bytes of a process's output, charged to ``owner``."""

    def __init__(self, capacity: int, ledger: ShareLedger, owner: Owner) -> None:
        self.capacity = capacity
        self._ledger = ledger
        self._owner = owner
        self._chunks: collections.deque[Chunk] = collections.deque()
        self.held = 0
        self.start = 0
        """Offset of the oldest byte still kept (everything before it was dropped)."""
        self.end = 0
        """Bytes written so far (both streams)."""
        self._changed = asyncio.Event()
        self.closed = False

    @property
    def dropped(self) -> int:
        return self.start

    def append(self, stream: int, data: bytes) -> None:
        if not data or self.closed:
            return
        if len(data) > self.capacity:
            # Only its tail can be kept; the head is dropped right away.
            cut = len(data) - self.capacity
            self._skip(cut)
            data = data[cut:]
        while self._chunks and self.held + len(data) > self.capacity:
            self._drop_oldest()
        while not self._ledger.try_add(self._owner, len(data)):
            if not self._chunks:
                self._skip(len(data))  # no room at all: this chunk is lost, and counted
                self.notify()
                return
            self._drop_oldest()
        self._chunks.append(Chunk(self.end, stream, data))
        self.held += len(data)
        self.end += len(data)
        self.notify()

    def _skip(self, size: int) -> None:
        self.end += size
        if not self._chunks:
            self.start = self.end

    def _drop_oldest(self) -> None:
        chunk = self._chunks.popleft()
        self.held -= len(chunk.data)
        self._ledger.remove(self._owner, len(chunk.data))
        self.start = self._chunks[0].offset if self._chunks else self.end

    def notify(self) -> None:
        """Wake every reader waiting in :meth:`changed`."""
        self._changed.set()
        self._changed = asyncio.Event()

    def read_from(self, offset: int) -> tuple[int, list[Chunk]]:
        """(bytes dropped before what is returned, the chunks at or after ``offset``)."""
        offset = min(max(offset, 0), self.end)
        dropped = max(0, self.start - offset)
        chunks: list[Chunk] = []
        for chunk in self._chunks:
            if chunk.end <= offset:
                continue
            if chunk.offset < offset:
                chunk = Chunk(offset, chunk.stream, chunk.data[offset - chunk.offset :])
            chunks.append(chunk)
        return dropped, chunks

    def stream_bytes(self, stream: int) -> bytes:
        """All kept bytes of one stream, joined."""
        return b"".join(c.data for c in self._chunks if c.stream == stream)

    @property
    def next_change(self) -> asyncio.Event:
        """An event set by the next append, close or :meth:`notify`: take it
        before reading, then wait on it, and no append between is missed."""
        return self._changed

    def close(self) -> None:
        """Free the kept bytes (and their charge); readers are woken."""
        self.closed = True
        self._ledger.remove(self._owner, self.held)
        self.held = 0
        self._chunks.clear()
        self.start = self.end
        self.notify()
