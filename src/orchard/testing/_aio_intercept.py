"""grpc.aio client interceptors over the fake's asyncio channel.

grpc.aio applies interceptors only inside its own channels, so the fake runs
the chain itself, the way grpc.aio's ``_interceptor.py`` does: each
interceptor gets ``continuation(client_call_details, request)`` (a coroutine
returning the next call) and may return that call, or a response (unary) or
an async iterable of responses (streaming) of its own. The chain runs in a
task started when the call is made; the object returned to the caller is
awaitable or async-iterable like any grpc.aio call and delegates ``code()``,
``details()``, ``cancel()`` ... to the call the chain ended with.
``client_call_details.method`` is bytes, as grpc.aio gives it.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import AsyncIterator, Callable, Generator, Sequence
from typing import Any

import grpc
import grpc.aio

_EOF = grpc.aio.EOF  # type: ignore[attr-defined]  # missing from grpc's type stubs

INTERCEPTOR_KINDS: dict[str, tuple[type[Any], str]] = {
    "unary_unary": (grpc.aio.UnaryUnaryClientInterceptor, "intercept_unary_unary"),
    "unary_stream": (grpc.aio.UnaryStreamClientInterceptor, "intercept_unary_stream"),
    "stream_unary": (grpc.aio.StreamUnaryClientInterceptor, "intercept_stream_unary"),
    "stream_stream": (grpc.aio.StreamStreamClientInterceptor, "intercept_stream_stream"),
}

# (details, request) -> the fake's own call for them.
Invoke = Callable[[grpc.aio.ClientCallDetails, Any], Any]


def for_kind(interceptors: Sequence[Any], kind: str) -> list[Any]:
    """The interceptors that intercept calls of ``kind`` (grpc.aio sorts them the same way)."""
    cls = INTERCEPTOR_KINDS[kind][0]
    return [i for i in interceptors if isinstance(i, cls)]


class _Writes:
    """A request stream fed by ``write()`` / ``done_writing()`` on an intercepted call."""

    def __init__(self) -> None:
        self.queue: asyncio.Queue[Any] = asyncio.Queue()

    async def __aiter__(self) -> AsyncIterator[Any]:
        while (item := await self.queue.get()) is not _EOF:
            yield item


class _Answered(grpc.aio.Call):  # type: ignore[misc]
    """A finished call carrying an interceptor's own answer: a response, or (streaming)
    an async iterable of responses."""

    def __init__(self, answer: Any) -> None:
        self._answer = answer

    def __await__(self) -> Generator[Any, None, Any]:
        async def answer() -> Any:
            return self._answer

        return answer().__await__()

    def __aiter__(self) -> AsyncIterator[Any]:
        return aiter(self._answer)

    async def code(self) -> grpc.StatusCode:
        return grpc.StatusCode.OK

    async def details(self) -> str:
        return ""

    async def initial_metadata(self) -> grpc.aio.Metadata:
        return grpc.aio.Metadata()

    async def trailing_metadata(self) -> grpc.aio.Metadata:
        return grpc.aio.Metadata()

    async def wait_for_connection(self) -> None:
        return None

    def cancel(self) -> bool:
        return False

    def cancelled(self) -> bool:
        return False

    def done(self) -> bool:
        return True

    def time_remaining(self) -> float | None:
        return None

    def add_done_callback(self, callback: Callable[[Any], None]) -> None:
        callback(self)


class InterceptedCall:
    """A call whose interceptor chain runs in a task; see the module docstring."""

    def __init__(
        self,
        kind: str,
        interceptors: list[Any],
        details: grpc.aio.ClientCallDetails,
        request: Any,
        invoke: Invoke,
    ) -> None:
        self._method_name = INTERCEPTOR_KINDS[kind][1]
        self._invoke = invoke
        self._writes: _Writes | None = None
        if kind.startswith("stream") and request is None:
            self._writes = _Writes()
            request = self._writes
        self._responses: AsyncIterator[Any] | None = None
        self._awaited: asyncio.Future[Any] | None = None
        self._done_callbacks: list[Callable[[Any], None]] = []
        self._task = asyncio.get_running_loop().create_task(
            self._run(interceptors, details, request)
        )

    async def _run(
        self, chain: list[Any], details: grpc.aio.ClientCallDetails, request: Any
    ) -> Any:
        if not chain:
            return self._invoke(details, request)
        continuation = functools.partial(self._run, chain[1:])
        result = await getattr(chain[0], self._method_name)(continuation, details, request)
        if isinstance(result, grpc.aio.Call):
            return result
        # An interceptor answered itself: the next one up still gets a call (grpc.aio
        # wraps such answers the same way).
        return _Answered(result)

    async def _inner(self) -> Any:
        """What the chain ended with: the fake's call, or an interceptor's own answer."""
        return await self._task

    @staticmethod
    def _is_call(result: Any) -> bool:
        return isinstance(result, grpc.aio.Call)

    # ---- responses ----------------------------------------------------------------

    async def _response(self) -> Any:
        try:
            result = await self._inner()
            return await result if self._is_call(result) else result
        finally:
            self._fire_done()

    def __await__(self) -> Generator[Any, None, Any]:
        if self._awaited is None:
            self._awaited = asyncio.ensure_future(self._response())
        return self._awaited.__await__()

    async def read(self) -> Any:
        try:
            if self._responses is None:
                self._responses = aiter(await self._inner())
            return await anext(self._responses)
        except StopAsyncIteration:
            self._fire_done()
            return _EOF
        except BaseException:
            self._fire_done()
            raise

    async def _iterate(self) -> AsyncIterator[Any]:
        while (message := await self.read()) is not _EOF:
            yield message

    def __aiter__(self) -> AsyncIterator[Any]:
        return self._iterate()

    async def write(self, request: Any) -> None:
        if self._writes is None:
            raise grpc.aio.UsageError("write() on a call that was given a request iterator")
        await self._writes.queue.put(request)

    async def done_writing(self) -> None:
        if self._writes is not None:
            await self._writes.queue.put(_EOF)

    # ---- grpc.aio.Call, delegated to the call the chain ended with ---------------

    async def code(self) -> grpc.StatusCode:
        result = await self._inner()
        return await result.code() if self._is_call(result) else grpc.StatusCode.OK

    async def details(self) -> str:
        result = await self._inner()
        return await result.details() if self._is_call(result) else ""

    async def initial_metadata(self) -> grpc.aio.Metadata:
        result = await self._inner()
        return await result.initial_metadata() if self._is_call(result) else grpc.aio.Metadata()

    async def trailing_metadata(self) -> grpc.aio.Metadata:
        result = await self._inner()
        return await result.trailing_metadata() if self._is_call(result) else grpc.aio.Metadata()

    async def wait_for_connection(self) -> None:
        return None

    def cancel(self) -> bool:
        if not self._task.done():
            return self._task.cancel()
        if self._task.cancelled() or self._task.exception() is not None:
            return False
        result = self._task.result()
        return bool(result.cancel()) if self._is_call(result) else False

    def cancelled(self) -> bool:
        if self._task.cancelled():
            return True
        if not self._task.done() or self._task.exception() is not None:
            return False
        result = self._task.result()
        return bool(result.cancelled()) if self._is_call(result) else False

    def done(self) -> bool:
        if not self._task.done():
            return False
        if self._task.cancelled() or self._task.exception() is not None:
            return True
        result = self._task.result()
        return bool(result.done()) if self._is_call(result) else True

    def time_remaining(self) -> float | None:
        if self._task.done() and not self._task.cancelled() and self._task.exception() is None:
            result = self._task.result()
            if self._is_call(result):
                return result.time_remaining()  # type: ignore[no-any-return]
        return None

    def add_done_callback(self, callback: Callable[[Any], None]) -> None:
        if self.done():
            callback(self)
        else:
            self._done_callbacks.append(callback)

    def _fire_done(self) -> None:
        callbacks, self._done_callbacks = self._done_callbacks, []
        for fn in callbacks:
            fn(self)


class InterceptedUnaryUnaryCall(InterceptedCall, grpc.aio.UnaryUnaryCall):  # type: ignore[misc,type-arg]
    pass


class InterceptedUnaryStreamCall(InterceptedCall, grpc.aio.UnaryStreamCall):  # type: ignore[misc,type-arg]
    pass


class InterceptedStreamUnaryCall(InterceptedCall, grpc.aio.StreamUnaryCall):  # type: ignore[misc,type-arg]
    pass


class InterceptedStreamStreamCall(InterceptedCall, grpc.aio.StreamStreamCall):  # type: ignore[misc,type-arg]
    pass


INTERCEPTED_CALLS: dict[str, type[InterceptedCall]] = {
    "unary_unary": InterceptedUnaryUnaryCall,
    "unary_stream": InterceptedUnaryStreamCall,
    "stream_unary": InterceptedStreamUnaryCall,
    "stream_stream": InterceptedStreamStreamCall,
}
