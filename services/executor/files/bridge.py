"""Moving chunks between the event loop and one worker thread per transfer.

File I/O blocks, so each transfer runs its blocking part as one task on a
bounded thread pool, handed out by fair share (:class:`TransferWorkers`: per
sandbox, per tenant, per node) so one tenant cannot hold every worker (not a thread hop per chunk: at 1 MiB chunks that would be
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
import collections
import contextlib
import os
import queue
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Generic, TypeVar, cast

from orchard.common.errors import quota_exceeded

from ..shares import Owner, ShareLedger, ShareLimits, call_owner

T = TypeVar("T")
R = TypeVar("R")

DEFAULT_MAX_PENDING = 4
WORKERS_ENV = "ORCHARD_FILE_WORKERS"
WORKERS_PER_TENANT_ENV = "ORCHARD_FILE_WORKERS_PER_TENANT"
WORKERS_PER_SANDBOX_ENV = "ORCHARD_FILE_WORKERS_PER_SANDBOX"
WORKER_WAIT_ENV = "ORCHARD_FILE_WORKER_WAIT_SECONDS"
RETRY_AFTER_SECONDS = 1.0
_workers: TransferWorkers | None = None
_workers_lock = threading.Lock()


class TransferWorkers:
    """The node-wide pool of file-transfer threads, handed out by fair share.

    A transfer holds a worker for its whole duration (a slow client holds it
    while it dawdles), so the pool is a node-wide resource one tenant could
    take whole. Each transfer first gets a share (:class:`ShareLedger`: per
    sandbox, per tenant, node total = the pool size), so the pool never
    queues internally and one tenant always leaves workers to the others. A
    transfer over its share waits, holding no thread, in arrival order among
    those that fit; after ``wait_seconds`` it is refused with
    RESOURCE_EXHAUSTED naming the share that is full.
    """

    def __init__(self, limits: ShareLimits, wait_seconds: float) -> None:
        self.ledger = ShareLedger(limits, "file transfers")
        self._wait_seconds = wait_seconds
        self._pool = ThreadPoolExecutor(max_workers=limits.node, thread_name_prefix="orchard-files")
        self._waiters: collections.deque[tuple[Owner, asyncio.Future[None]]] = collections.deque()

    async def run(self, fn: Callable[..., R], *args: Any) -> asyncio.Future[R]:
        """Start ``fn(*args)`` on a worker once the call's owner has a share free."""
        owner = call_owner()
        await self._admit(owner)
        try:
            worker = asyncio.get_running_loop().run_in_executor(self._pool, fn, *args)
        except BaseException:
            self._release(owner)
            raise
        worker.add_done_callback(lambda _: self._release(owner))
        return worker

    async def _admit(self, owner: Owner) -> None:
        if self.ledger.try_add(owner, 1):
            return
        granted: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        entry = (owner, granted)
        self._waiters.append(entry)
        try:
            await asyncio.wait_for(asyncio.shield(granted), self._wait_seconds)
        except TimeoutError:
            if granted.done() and not granted.cancelled():
                return  # granted in the same loop turn as the timeout: it is ours
            why = self.ledger.refusal(owner, 1) or "the node's file workers are busy"
            raise quota_exceeded(
                f"no file-transfer worker free after {self._wait_seconds:g} s: {why}",
                retry_after=RETRY_AFTER_SECONDS,
            ) from None
        except BaseException:
            if granted.done() and not granted.cancelled():
                self._release(owner)  # granted just as the caller went away
            raise
        finally:
            with contextlib.suppress(ValueError):
                self._waiters.remove(entry)
            if not granted.done():
                granted.cancel()

    def _release(self, owner: Owner) -> None:
        self.ledger.remove(owner, 1)
        for entry in list(self._waiters):
            waiter, granted = entry
            if granted.done():
                self._waiters.remove(entry)
            elif self.ledger.try_add(waiter, 1):
                self._waiters.remove(entry)
                granted.set_result(None)


def _env_int(name: str, default: int) -> int:
    return int(os.environ.get(name, str(default)))


def transfer_workers() -> TransferWorkers:
    """The node's transfer workers (``ORCHARD_FILE_WORKERS``, default 32; per tenant
    ``ORCHARD_FILE_WORKERS_PER_TENANT``, default half; per sandbox
    ``ORCHARD_FILE_WORKERS_PER_SANDBOX``, default a quarter; waiting at most
    ``ORCHARD_FILE_WORKER_WAIT_SECONDS``, default 30)."""
    global _workers
    with _workers_lock:
        if _workers is None:
            node = max(1, _env_int(WORKERS_ENV, 32))
            limits = ShareLimits(
                per_sandbox=_env_int(WORKERS_PER_SANDBOX_ENV, max(1, node // 4)),
                per_tenant=_env_int(WORKERS_PER_TENANT_ENV, max(1, node // 2)),
                node=node,
            )
            wait = float(os.environ.get(WORKER_WAIT_ENV, "30"))
            _workers = TransferWorkers(limits, wait)
        return _workers


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
    worker = await transfer_workers().run(outbox._run, produce)
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
    worker = await transfer_workers().run(consume, source)
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
