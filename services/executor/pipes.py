"""Reading a command's output pipes and feeding its stdin, on the event loop.

:class:`OutputPipe` reads one pipe with ``loop.add_reader`` and keeps at most
``limit`` bytes: past the cap it keeps reading and discarding, so a command
that floods its output never blocks on a full pipe (it would otherwise never
exit). Every kept byte is charged to the call's :class:`OutputCharge` (the
node's output budget, by fair share); a chunk that does not fit is dropped
and the charge marks the call refused. :class:`InputPipe` writes stdin
without blocking the loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Callable

from .output_budget import OutputCharge

READ_SIZE = 256 * 1024
# Reads per readiness callback: enough to empty a full pipe, bounded so one
# flooding command cannot starve the loop.
READS_PER_WAKEUP = 1


class CappedOutput:
    """One output stream's bytes, kept up to ``limit``; the rest is dropped and noted."""

    __slots__ = ("_charge", "_chunks", "_remaining", "truncated")

    def __init__(self, limit: int, charge: OutputCharge | None = None) -> None:
        self._chunks: list[bytes] = []
        self._remaining = limit
        self._charge = charge
        self.truncated = False

    def keep(self, data: bytes) -> bytes:
        """The part of ``data`` within the cap (b"" once it is reached)."""
        if self._remaining <= 0:
            if data:
                self.truncated = True
            return b""
        if len(data) > self._remaining:
            data = data[: self._remaining]
            self.truncated = True
        self._remaining -= len(data)
        if self._charge is not None and not self._charge.take(len(data)):
            # The call is refused: what was kept is freed now, not when the
            # frames that still reference this object are collected.
            self._chunks.clear()
            self.truncated = True
            return b""
        return data

    def append(self, data: bytes) -> None:
        kept = self.keep(data)
        if kept:
            self._chunks.append(kept)

    def data(self) -> bytes:
        if len(self._chunks) == 1:
            return self._chunks[0]
        return b"".join(self._chunks)


class OutputPipe:
    """One output stream of a command, read until EOF or :meth:`close`.

    With ``on_data`` set every kept chunk goes to it (streaming); otherwise the
    chunks are collected for :meth:`data`.
    """

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        fd: int,
        limit: int,
        on_data: Callable[[bytes], None] | None = None,
        charge: OutputCharge | None = None,
    ) -> None:
        self._loop = loop
        self._fd: int | None = fd
        self._remaining = limit
        self._on_data = on_data
        self._charge = charge
        self._resume: asyncio.TimerHandle | None = None
        self._chunks: list[bytes] = []
        self.truncated = False
        self.eof: asyncio.Future[None] = loop.create_future()
        loop.add_reader(fd, self._on_readable)

    def _on_readable(self) -> None:
        fd = self._fd
        if fd is None:
            return
        if self._charge is not None and (pause := self._charge.pause_seconds()) > 0:
            # The tenant is past its output pace: leave the pipe unread a moment
            # (the command blocks on it, as on a slow terminal).
            self._loop.remove_reader(fd)
            self._resume = self._loop.call_later(pause, self._read_again)
            return
        for _ in range(READS_PER_WAKEUP):
            try:
                data = os.read(fd, READ_SIZE)
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                data = b""
            if not data:
                self.close()
                return
            if self._charge is not None:
                self._charge.read(len(data))
            self._keep(data)
            if len(data) < READ_SIZE:
                return

    def _keep(self, data: bytes) -> None:
        if self._remaining <= 0:
            self.truncated = True
            return
        if len(data) > self._remaining:
            data = data[: self._remaining]
            self.truncated = True
        self._remaining -= len(data)
        if self._charge is not None and not self._charge.take(len(data)):
            self._chunks.clear()  # the call is refused: free what was kept now
            self.truncated = True
            return
        if self._on_data is not None:
            self._on_data(data)
        else:
            self._chunks.append(data)

    def _read_again(self) -> None:
        self._resume = None
        if self._fd is not None:
            self._loop.add_reader(self._fd, self._on_readable)

    def unpause(self) -> None:
        """Read now even if paused: the command has exited, and what is left in the
        pipe (at most its capacity) must not be lost to the drain's short grace."""
        if self._resume is not None:
            self._resume.cancel()
            self._read_again()

    def data(self) -> bytes:
        if len(self._chunks) == 1:
            return self._chunks[0]
        return b"".join(self._chunks)

    @property
    def closed(self) -> bool:
        return self._fd is None

    def close(self) -> None:
        """Stop reading (EOF, or giving up on a pipe a background job holds)."""
        fd = self._fd
        if fd is None:
            return
        self._fd = None
        if self._resume is not None:
            self._resume.cancel()
            self._resume = None
        self._loop.remove_reader(fd)
        os.close(fd)
        if not self.eof.done():
            self.eof.set_result(None)


class InputPipe:
    """A command's stdin: writes wait for room in the pipe, never the loop."""

    def __init__(self, loop: asyncio.AbstractEventLoop, fd: int) -> None:
        self._loop = loop
        self._fd: int | None = fd
        self.broken = False

    async def write(self, data: bytes) -> None:
        """Write all of ``data``; silently dropped once the reader has gone."""
        view = memoryview(data)
        while view and self._fd is not None and not self.broken:
            try:
                n = os.write(self._fd, view)
            except (BlockingIOError, InterruptedError):
                await self._writable()
                continue
            except (BrokenPipeError, ConnectionResetError):
                self.broken = True
                return
            view = view[n:]

    async def _writable(self) -> None:
        fd = self._fd
        if fd is None:
            return
        fut: asyncio.Future[None] = self._loop.create_future()

        def ready() -> None:
            if not fut.done():
                fut.set_result(None)

        self._loop.add_writer(fd, ready)
        try:
            await fut
        finally:
            self._loop.remove_writer(fd)

    def close(self) -> None:
        fd = self._fd
        if fd is not None:
            self._fd = None
            with contextlib.suppress(OSError):
                os.close(fd)
