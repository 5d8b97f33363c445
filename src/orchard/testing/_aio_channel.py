"""A ``grpc.aio.Channel`` whose calls are served in process by the fake's servicers.

The same :class:`~._rpc.RpcRun` as the sync channel serves each call on a
worker thread; this side only waits without blocking the event loop (the
worker wakes the loop through ``call_soon_threadsafe``). Unary calls are
awaitable, streaming ones async-iterable (and have ``read()``), request
streams may be async or plain iterables or be fed with ``write()`` /
``done_writing()``, and failures are raised as real ``grpc.aio.AioRpcError``
with the servicer's trailing metadata. Cancelling the awaiting task cancels
the call, as grpc.aio does.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
from collections.abc import (
    AsyncIterable,
    AsyncIterator,
    Callable,
    Generator,
    Iterable,
    Iterator,
    Sequence,
)
from typing import Any

import grpc
import grpc.aio

from ._aio_intercept import INTERCEPTED_CALLS, for_kind
from ._channel import as_metadata
from ._router import ChannelFactories, Router
from ._rpc import Deserializer, RpcRun, Serializer, Status

_END_OF_REQUESTS = object()
_EOF = grpc.aio.EOF  # type: ignore[attr-defined]  # missing from grpc's type stubs


def aio_error(status: Status) -> grpc.aio.AioRpcError:
    return grpc.aio.AioRpcError(
        status.code,
        grpc.aio.Metadata(),
        grpc.aio.Metadata(*status.trailing_metadata),
        status.details,
        f"fake orchard: {status.code.name}: {status.details}",
    )


class _RequestFeed:
    """Requests from the event loop's side, pulled one at a time by the servicer thread."""

    def __init__(self, loop: asyncio.AbstractEventLoop, serialize: Serializer, source: Any) -> None:
        self._loop = loop
        self._serialize = serialize
        self._written: asyncio.Queue[Any] | None = None
        if source is None:
            self._written = asyncio.Queue()
            self._source: AsyncIterator[Any] = self._from_writes()
        elif isinstance(source, AsyncIterable):
            self._source = aiter(source)
        else:
            self._source = self._from_plain(source)

    async def _from_writes(self) -> AsyncIterator[Any]:
        assert self._written is not None
        while (item := await self._written.get()) is not _END_OF_REQUESTS:
            yield item

    @staticmethod
    async def _from_plain(source: Iterable[Any]) -> AsyncIterator[Any]:
        for item in source:
            yield item

    async def write(self, request: Any) -> None:
        if self._written is None:
            raise grpc.aio.UsageError("write() on a call that was given a request iterator")
        await self._written.put(request)

    async def done_writing(self) -> None:
        if self._written is not None:
            await self._written.put(_END_OF_REQUESTS)

    async def _next(self) -> tuple[bool, Any]:
        try:
            return True, await anext(self._source)
        except StopAsyncIteration:
            return False, None

    def __iter__(self) -> Iterator[bytes]:
        while True:
            try:
                future = asyncio.run_coroutine_threadsafe(self._next(), self._loop)
            except RuntimeError:  # the loop has closed under a still-running servicer
                return
            while True:
                try:
                    more, request = future.result(timeout=0.5)
                    break
                except concurrent.futures.TimeoutError:
                    if self._loop.is_closed():
                        return
            if not more:
                return
            yield self._serialize(request)


class _AioCall:
    """The common part of the four grpc.aio call kinds."""

    def __init__(
        self,
        router: Router,
        address: str,
        method: str,
        requests: Iterable[bytes],
        deserialize: Deserializer | None,
        timeout: float | None,
        metadata: Any,
        feed: _RequestFeed | None = None,
    ) -> None:
        self._loop = asyncio.get_running_loop()
        self._deserialize = deserialize or (lambda b: b)
        self._feed = feed
        self._wake = asyncio.Event()
        self._done_callbacks: list[Callable[[Any], None]] = []
        self._failure: Status | None = None
        self._run: RpcRun | None = None
        handler = router.handler(address, method)
        if isinstance(handler, Status):
            self._failure = handler
            return
        run = RpcRun(method, handler, iter(requests), as_metadata(metadata), timeout)
        run.notify = self._notify
        self._run = run

    def _notify(self) -> None:
        # A closed loop raises RuntimeError: nobody is waiting any more.
        with contextlib.suppress(RuntimeError):
            self._loop.call_soon_threadsafe(self._wake.set)

    def _status(self) -> Status | None:
        return self._failure if self._run is None else self._run.status

    async def _next(self) -> bytes | Status:
        run = self._run
        if run is None:
            assert self._failure is not None
            return self._failure
        while True:
            self._wake.clear()
            remaining = run.remaining()
            if remaining is not None and remaining <= 0:
                run.expire()
            item = run.next_item(0)
            if item is not None:
                return item
            try:
                await asyncio.wait_for(self._wake.wait(), remaining)
            except TimeoutError:
                continue
            except asyncio.CancelledError:
                run.cancel()
                raise

    def _raise_for(self, status: Status) -> None:
        self._fire_done()
        if status.code == grpc.StatusCode.CANCELLED and self._run is not None and self.cancelled():
            raise asyncio.CancelledError()
        raise aio_error(status)

    def _fire_done(self) -> None:
        callbacks, self._done_callbacks = self._done_callbacks, []
        for fn in callbacks:
            fn(self)

    async def _final(self) -> Status:
        """The call's status once it has ended (reads nothing from the stream)."""
        run = self._run
        if run is None:
            assert self._failure is not None
            return self._failure
        while not run.wait_finished(0):
            self._wake.clear()
            if run.wait_finished(0):
                break
            remaining = run.remaining()
            if remaining is not None and remaining <= 0:
                run.expire()
                continue
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), remaining)
        assert run.status is not None
        return run.status

    # ---- grpc.aio.Call ---------------------------------------------------------

    def cancel(self) -> bool:
        if self._run is None:
            return False
        cancelled = self._run.cancel()
        self._fire_done()
        return cancelled

    def cancelled(self) -> bool:
        status = self._status()
        return (
            status is not None
            and status.code == grpc.StatusCode.CANCELLED
            and self._failure is None
            and self._run is not None
            and self._run.context.abandoned
        )

    def done(self) -> bool:
        return self._status() is not None

    def add_done_callback(self, callback: Callable[[Any], None]) -> None:
        if self.done():
            callback(self)
        else:
            self._done_callbacks.append(callback)

    def time_remaining(self) -> float | None:
        remaining = None if self._run is None else self._run.remaining()
        return None if remaining is None else max(0.0, remaining)

    async def initial_metadata(self) -> grpc.aio.Metadata:
        return grpc.aio.Metadata()

    async def trailing_metadata(self) -> grpc.aio.Metadata:
        return grpc.aio.Metadata(*(await self._final()).trailing_metadata)

    async def code(self) -> grpc.StatusCode:
        return (await self._final()).code

    async def details(self) -> str:
        return (await self._final()).details

    async def wait_for_connection(self) -> None:
        return None

    # ---- request streams ---------------------------------------------------------

    async def write(self, request: Any) -> None:
        if self._feed is None:
            raise grpc.aio.UsageError("write() on a call without a request stream")
        await self._feed.write(request)

    async def done_writing(self) -> None:
        if self._feed is not None:
            await self._feed.done_writing()


class _UnaryResponse(_AioCall):
    _awaited: asyncio.Future[Any] | None = None

    async def _response(self) -> Any:
        item = await self._next()
        if isinstance(item, Status):
            self._raise_for(item)
        end = await self._next()
        if isinstance(end, Status) and end.code != grpc.StatusCode.OK:
            self._raise_for(end)
        self._fire_done()
        return self._deserialize(item)  # type: ignore[arg-type]

    def __await__(self) -> Generator[Any, None, Any]:
        # Awaiting a call again (an interceptor awaits it, then its caller) gives the
        # same response or error, as grpc.aio's calls do.
        if self._awaited is None:
            self._awaited = asyncio.ensure_future(self._response())
        return self._awaited.__await__()


class _StreamResponse(_AioCall):
    async def read(self) -> Any:
        item = await self._next()
        if isinstance(item, Status):
            if item.code == grpc.StatusCode.OK:
                self._fire_done()
                return _EOF
            self._raise_for(item)
        return self._deserialize(item)  # type: ignore[arg-type]

    async def _responses(self) -> AsyncIterator[Any]:
        while (message := await self.read()) is not _EOF:
            yield message

    def __aiter__(self) -> AsyncIterator[Any]:
        return self._responses()


class UnaryUnaryCall(_UnaryResponse, grpc.aio.UnaryUnaryCall):  # type: ignore[misc,type-arg]
    pass


class UnaryStreamCall(_StreamResponse, grpc.aio.UnaryStreamCall):  # type: ignore[misc,type-arg]
    pass


class StreamUnaryCall(_UnaryResponse, grpc.aio.StreamUnaryCall):  # type: ignore[misc,type-arg]
    pass


class StreamStreamCall(_StreamResponse, grpc.aio.StreamStreamCall):  # type: ignore[misc,type-arg]
    pass


class _MultiCallable:
    """One method of one channel; ``call_kind`` is the grpc.aio call it returns.
    ``credentials``, ``wait_for_ready`` and ``compression`` mean nothing in process."""

    call_kind: type[_AioCall]
    kind: str
    request_streaming = False

    def __init__(
        self,
        channel: AsyncFakeChannel,
        method: str,
        serialize: Serializer | None,
        deserialize: Deserializer | None,
    ) -> None:
        self._channel = channel
        self._method = method
        self._serialize: Serializer = serialize or (lambda m: m)
        self._deserialize = deserialize

    def __call__(
        self, request: Any = None, timeout: float | None = None, metadata: Any = None, **_: Any
    ) -> Any:
        chain = for_kind(self._channel.interceptors, self.kind)
        if chain:
            # bytes, as grpc.aio's own channel gives it (its type stubs say str).
            method: Any = self._method.encode()
            details = grpc.aio.ClientCallDetails(method, timeout, metadata, None, None)
            return INTERCEPTED_CALLS[self.kind](self.kind, chain, details, request, self._invoke)
        return self._direct(self._method, request, timeout, metadata)

    def _invoke(self, details: grpc.aio.ClientCallDetails, request: Any) -> _AioCall:
        """The end of an interceptor chain: the call as the interceptors left its details."""
        method = details.method
        name = method.decode() if isinstance(method, bytes) else str(method)
        return self._direct(name, request, details.timeout, details.metadata)

    def _direct(self, method: str, request: Any, timeout: float | None, metadata: Any) -> _AioCall:
        ch = self._channel
        if not self.request_streaming:
            requests: Iterable[bytes] = [self._serialize(request)]
            feed = None
        else:
            requests = feed = _RequestFeed(asyncio.get_running_loop(), self._serialize, request)
        return self.call_kind(
            ch.router, ch.address, method, requests, self._deserialize, timeout, metadata, feed
        )


class _UnaryUnary(_MultiCallable, grpc.aio.UnaryUnaryMultiCallable):  # type: ignore[misc,type-arg]
    kind = "unary_unary"
    call_kind = UnaryUnaryCall


class _UnaryStream(_MultiCallable, grpc.aio.UnaryStreamMultiCallable):  # type: ignore[misc,type-arg]
    kind = "unary_stream"
    call_kind = UnaryStreamCall


class _StreamUnary(_MultiCallable, grpc.aio.StreamUnaryMultiCallable):  # type: ignore[misc,type-arg]
    kind = "stream_unary"
    call_kind = StreamUnaryCall
    request_streaming = True


class _StreamStream(_MultiCallable, grpc.aio.StreamStreamMultiCallable):  # type: ignore[misc,type-arg]
    kind = "stream_stream"
    call_kind = StreamStreamCall
    request_streaming = True


class AsyncFakeChannel(ChannelFactories, grpc.aio.Channel):  # type: ignore[misc]
    """An asyncio channel to one of the fake's addresses."""

    kinds = {
        "unary_unary": _UnaryUnary,
        "unary_stream": _UnaryStream,
        "stream_unary": _StreamUnary,
        "stream_stream": _StreamStream,
    }

    def __init__(self, router: Router, address: str, interceptors: Sequence[Any] = ()) -> None:
        self.router = router
        self.address = address
        self.interceptors = tuple(interceptors)
        self.closed = False

    async def __aenter__(self) -> AsyncFakeChannel:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self, grace: float | None = None) -> None:
        self.closed = True

    def get_state(self, try_to_connect: bool = False) -> grpc.ChannelConnectivity:
        return grpc.ChannelConnectivity.READY

    async def wait_for_state_change(self, last_observed_state: grpc.ChannelConnectivity) -> None:
        await asyncio.Event().wait()  # the fake's state never changes

    async def channel_ready(self) -> None:
        return None
