"""Moving chunks between the event loop and one worker thread per transfer.

File I/O blocks, so each transfer runs its blocking part as one task on a
bounded thread pool (not a thread hop per chunk: at 1 MiB chunks that would be
cheap, but clients may send 64 KiB ones). Both directions are flow-controlled
with a small credit window, so a slow client makes the worker wait instead of
making the executor buffer a whole file or tree, and a fast client cannot push
more than ``max_pending`` chunks ahead of the disk.

Cancellation: when the RPC goes away, the worker is told to stop at its next
chunk boundary (it raises :class:`TransferAborted` and cleans up after itself:
temp files removed, fds closed).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import queue
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Generic, TypeVar, cast

T = TypeVar("T")
R = TypeVar("R")

DEFAULT_MAX_PENDING = 4
_pool: ThreadPoolExecutor | None = None
_pool_lock = threading.Lock()


def transfer_pool() -> ThreadPoolExecutor:
    """The node-wide pool for file transfers (``ORCHARD_FILE_WORKERS``, default 32).

    A transfer holds a worker for its whole duration, so this bounds how many
    run at once; later ones queue until a worker is free.
    """
    global _pool
    with _pool_lock:
        if _pool is None:
            workers = int(os.environ.get("ORCHARD_FILE_WORKERS", "32"))
            _pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="orchard-files")
        return _pool


class TransferAborted(Exception):
    """The other side of the transfer went away; the worker stops and cleans up."""


class _Credits:
    """A counting semaphore the thread waits on and the loop releases, closable."""

    def __init__(self, count: int) -> None:
        self._count = count
        self._closed = False
        self._cond = threading.Condition()

    def acquire(self) -> bool:
        with self._cond:
            while self._count == 0 and not self._closed:
                self._cond.wait()
            if self._closed:
                return False
            self._count -= 1
            return True

    def release(self) -> None:
        with self._cond:
            self._count += 1
            self._cond.notify()

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()


class _Done:
    pass


_DONE = _Done()


class Outbox(Generic[T]):
    """What a producing worker calls ``send`` on; the loop side iterates."""

    def __init__(self, loop: asyncio.AbstractEventLoop, max_pending: int) -> None:
        self._loop = loop
        self._credits = _Credits(max_pending)
        self._queue: asyncio.Queue[T | _Done] = asyncio.Queue()

    def send(self, item: T) -> None:
        """Hand ``item`` to the loop; block while ``max_pending`` items are unread."""
        if not self._credits.acquire():
            raise TransferAborted("the receiver went away")
        self._loop.call_soon_threadsafe(self._queue.put_nowait, item)

    def _finish(self) -> None:
        # RuntimeError: the loop is closed, nobody is listening any more.
        with contextlib.suppress(RuntimeError):
            self._loop.call_soon_threadsafe(self._queue.put_nowait, _DONE)

    def _run(self, produce: Callable[[Callable[[T], None]], None]) -> None:
        try:
            produce(self.send)
        finally:
            self._finish()

    async def _get(self) -> T | _Done:
        item = await self._queue.get()
        if not isinstance(item, _Done):
            self._credits.release()
        return item

    def close(self) -> None:
        self._credits.close()


async def stream_from_thread(
    produce: Callable[[Callable[[T], None]], None], *, max_pending: int = DEFAULT_MAX_PENDING
) -> AsyncIterator[T]:
    """Run ``produce(send)`` on the transfer pool and yield what it sends, in order.

    The producer's exception (e.g. a ServiceError) is raised here after the
    items sent before it. If the consumer stops early, the producer's next
    ``send`` raises TransferAborted.
    """
    loop = asyncio.get_running_loop()
    outbox: Outbox[T] = Outbox(loop, max_pending)
    worker = loop.run_in_executor(transfer_pool(), outbox._run, produce)
    worker.add_done_callback(_consume_result)
    try:
        while True:
            item = await outbox._get()
            if isinstance(item, _Done):
                break
            yield item
        await worker
    finally:
        outbox.close()


def _consume_result(fut: asyncio.Future[Any]) -> None:
    """Mark a finished future's exception as retrieved (it is re-raised elsewhere)."""
    if not fut.cancelled():
        fut.exception()


class _Abort:
    pass


_ABORT = _Abort()


class ChunkSource:
    """The worker's side of an incoming stream: an iterator and a ``read(n)`` file."""

    def __init__(self, loop: asyncio.AbstractEventLoop, space: asyncio.Semaphore) -> None:
        self._loop = loop
        self._space = space
        self._queue: queue.SimpleQueue[bytes | _Done | _Abort] = queue.SimpleQueue()
        self._buf = b""
        self._pos = 0
        self._eof = False

    # loop side
    def put(self, chunk: bytes) -> None:
        self._queue.put(chunk)

    def finish(self) -> None:
        self._queue.put(_DONE)

    def abort(self) -> None:
        self._queue.put(_ABORT)

    # worker side
    def next_chunk(self) -> bytes | None:
        """The next chunk, None at the end of the stream; raise TransferAborted."""
        if self._eof:
            return None
        item = self._queue.get()
        if isinstance(item, _Abort):
            self._eof = True
            raise TransferAborted("the client stream ended abnormally")
        if isinstance(item, _Done):
            self._eof = True
            return None
        with contextlib.suppress(RuntimeError):
            self._loop.call_soon_threadsafe(self._space.release)
        return item

    def __iter__(self) -> Iterator[bytes]:
        while (chunk := self.next_chunk()) is not None:
            yield chunk

    def read(self, size: int = -1) -> bytes:
        """Up to ``size`` bytes (at most one chunk); b"" only at the end of the stream."""
        if self._pos >= len(self._buf):
            chunk = self.next_chunk()
            if chunk is None:
                return b""
            self._buf, self._pos = chunk, 0
        start = self._pos
        if size < 0 or size >= len(self._buf) - start:
            self._pos = len(self._buf)
            return self._buf if start == 0 else self._buf[start:]
        self._pos = start + size
        return self._buf[start : self._pos]


async def feed_thread(
    data: AsyncIterator[bytes],
    consume: Callable[[ChunkSource], R],
    *,
    max_pending: int = DEFAULT_MAX_PENDING,
) -> R:
    """Run ``consume(source)`` on the transfer pool while feeding it ``data``.

    Returns what ``consume`` returns, or raises what it raised. If ``data``
    fails (the client stream broke) the worker is aborted, allowed to clean
    up, and the stream's error is raised. If the worker finishes first (an
    error, or the tar end marker), the rest of ``data`` is not read.
    """
    loop = asyncio.get_running_loop()
    space = asyncio.Semaphore(max_pending)
    source = ChunkSource(loop, space)
    worker = loop.run_in_executor(transfer_pool(), consume, source)
    worker.add_done_callback(_consume_result)

    async def pump() -> None:
        try:
            async for chunk in data:
                if chunk:
                    await space.acquire()
                    source.put(chunk)
        except BaseException:
            source.abort()
            raise
        source.finish()

    feeder = asyncio.ensure_future(pump())
    feeder.add_done_callback(_consume_result)
    try:
        both: list[asyncio.Future[Any]] = [feeder, worker]
        await asyncio.wait(both, return_when=asyncio.FIRST_COMPLETED)
        if feeder.done() and not feeder.cancelled() and feeder.exception() is not None:
            # The client stream broke: that is the error to report, not the
            # TransferAborted the worker raises once it sees the abort.
            await asyncio.wait({worker})
            raise cast(BaseException, feeder.exception())
        return await worker
    finally:
        if not feeder.done():
            feeder.cancel()
            await asyncio.wait({feeder})
        if not worker.done():
            source.abort()
            await asyncio.wait({worker})
