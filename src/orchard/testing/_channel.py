"""A ``grpc.Channel`` whose calls are served in process by the fake's servicers.

Every request goes through the stub's own request serializer and every
response through its response deserializer, so protobuf encoding is
exercised exactly as over a socket. The objects returned behave like
grpcio's: unary calls answer ``__call__`` / ``with_call`` / ``future``;
streaming calls are iterators that are also ``grpc.Call`` and
``grpc.Future`` and have ``cancel()``; failures are raised as objects that
are ``grpc.RpcError``, ``grpc.Call`` and ``grpc.Future`` at once (what
``grpc.intercept_channel`` needs), with ``code()``, ``details()`` and
``trailing_metadata()``.
"""

from __future__ import annotations

import contextlib
import threading
import types
from collections.abc import Callable, Iterator
from typing import Any

import grpc

from ._router import ChannelFactories, Router
from ._rpc import Deserializer, Metadata, RpcRun, Serializer, Status

_NO_TRACEBACK: types.TracebackType | None = None


def as_metadata(metadata: Any) -> Metadata:
    """Client metadata as a tuple of pairs, checked like grpcio checks it."""
    pairs: list[tuple[str, str]] = []
    for key, value in metadata or ():
        if not isinstance(key, str) or key != key.lower() or not key:
            raise ValueError(f"metadata key {key!r} must be a non-empty lowercase str")
        pairs.append((key, value))
    return tuple(pairs)


class FakeRpcError(grpc.RpcError, grpc.Call, grpc.Future):  # type: ignore[misc,type-arg]
    """A finished, failed call: what grpcio raises (``_InactiveRpcError``)."""

    def __init__(self, status: Status) -> None:
        super().__init__(status.details)
        self._status = status

    def __str__(self) -> str:
        return f"<FakeRpcError {self._status.code.name}: {self._status.details}>"

    def code(self) -> grpc.StatusCode:
        return self._status.code

    def details(self) -> str:
        return self._status.details

    def trailing_metadata(self) -> Metadata:  # type: ignore[override]
        return self._status.trailing_metadata

    def initial_metadata(self) -> Metadata:
        return ()

    def is_active(self) -> bool:
        return False

    def time_remaining(self) -> float | None:  # type: ignore[override]
        return None

    def cancel(self) -> bool:
        return False

    def add_callback(self, callback: Callable[[], None]) -> bool:
        return False

    def cancelled(self) -> bool:
        return self._status.code == grpc.StatusCode.CANCELLED

    def running(self) -> bool:
        return False

    def done(self) -> bool:
        return True

    def result(self, timeout: float | None = None) -> Any:
        raise self

    def exception(self, timeout: float | None = None) -> BaseException:  # type: ignore[override]
        return self

    def traceback(self, timeout: float | None = None) -> types.TracebackType | None:
        return _NO_TRACEBACK

    def add_done_callback(self, fn: Callable[[Any], None]) -> None:
        fn(self)


def _failed(status: Status) -> FakeRpcError:
    return FakeRpcError(status)


class _Call(grpc.RpcError, grpc.Call, grpc.Future):  # type: ignore[misc,type-arg]
    """A call in flight; for streaming responses also the iterator over them.

    Like grpcio's rendezvous it is itself the ``RpcError`` raised when the
    stream ends with a failure.
    """

    def __init__(self, run: RpcRun, deserialize: Deserializer | None, streaming: bool) -> None:
        super().__init__()
        self._run = run
        self._deserialize = deserialize or (lambda b: b)
        self._streaming = streaming
        self._result_lock = threading.Lock()
        self._callback_lock = threading.Lock()
        # (response, failed) once a unary call has ended.
        self._outcome: tuple[Any, bool] | None = None
        self._callbacks: list[Callable[[Any], None]] = []
        self._watcher: threading.Thread | None = None

    def __del__(self) -> None:
        run = getattr(self, "_run", None)
        if run is not None and run.status is None:
            run.cancel("the call was dropped by the client")

    # ---- iteration (streaming responses) -------------------------------------

    def __iter__(self) -> Iterator[Any]:
        return self

    def __next__(self) -> Any:
        item = self._run.next_blocking()
        if isinstance(item, Status):
            self._fire_callbacks()
            if item.code == grpc.StatusCode.OK:
                raise StopIteration
            raise self
        return self._deserialize(item)

    def next(self) -> Any:
        return self.__next__()

    # ---- unary result ----------------------------------------------------------

    def _unary_result(self) -> Any:
        with self._result_lock:
            if self._outcome is None:
                item = self._run.next_blocking()
                response, failed = None, True
                if isinstance(item, bytes):
                    response = self._deserialize(item)
                    end = self._run.next_blocking()
                    failed = isinstance(end, Status) and end.code != grpc.StatusCode.OK
                self._outcome = (None if failed else response, failed)
        self._fire_callbacks()
        response, failed = self._outcome
        if failed:
            raise _failed(self._final_status())
        return response

    def _finished(self) -> bool:
        if self._streaming:
            return self._run.status is not None
        return self._outcome is not None

    def _final_status(self) -> Status:
        self._run.wait_finished(None)
        status = self._run.status
        assert status is not None
        return status

    # ---- grpc.Call ---------------------------------------------------------------

    def code(self) -> grpc.StatusCode:
        return self._final_status().code

    def details(self) -> str:
        return self._final_status().details

    def trailing_metadata(self) -> Metadata:  # type: ignore[override]
        return self._final_status().trailing_metadata

    def initial_metadata(self) -> Metadata:
        return ()

    def is_active(self) -> bool:
        return self._run.status is None

    def time_remaining(self) -> float | None:  # type: ignore[override]
        remaining = self._run.remaining()
        return None if remaining is None else max(0.0, remaining)

    def cancel(self) -> bool:
        cancelled = self._run.cancel()
        self._fire_callbacks()
        return cancelled

    def add_callback(self, callback: Callable[[], None]) -> bool:
        return self._run.context.add_callback(callback)

    # ---- grpc.Future ---------------------------------------------------------------

    def cancelled(self) -> bool:
        status = self._run.status
        return status is not None and status.code == grpc.StatusCode.CANCELLED

    def running(self) -> bool:
        return self._run.status is None

    def done(self) -> bool:
        return self._run.status is not None

    def result(self, timeout: float | None = None) -> Any:
        if self._streaming:
            raise TypeError("result() of a streaming call: iterate over it")
        if timeout is not None and not self._run.wait_finished(timeout):
            raise grpc.FutureTimeoutError()
        return self._unary_result()

    def exception(self, timeout: float | None = None) -> BaseException | None:  # type: ignore[override]
        if timeout is not None and not self._run.wait_finished(timeout):
            raise grpc.FutureTimeoutError()
        if self._streaming:
            status = self._final_status()
            return None if status.code == grpc.StatusCode.OK else self
        try:
            self._unary_result()
        except grpc.RpcError as exc:
            return exc
        return None

    def traceback(self, timeout: float | None = None) -> types.TracebackType | None:
        error = self.exception(timeout)
        return None if error is None else error.__traceback__

    def add_done_callback(self, fn: Callable[[Any], None]) -> None:
        """Run ``fn(self)`` when the call ends (at once if it has); never blocks."""
        with self._callback_lock:
            if not self._finished():
                self._callbacks.append(fn)
                if self._watcher is None and not self._streaming:
                    self._watcher = threading.Thread(target=self._watch, daemon=True)
                    self._watcher.start()
                return
        fn(self)

    def _watch(self) -> None:
        with contextlib.suppress(grpc.RpcError):
            self._unary_result()

    def _fire_callbacks(self) -> None:
        with self._callback_lock:
            callbacks, self._callbacks = self._callbacks, []
        for fn in callbacks:
            fn(self)


class _MultiCallable:
    """One method of one channel. ``credentials``, ``wait_for_ready`` and
    ``compression`` are accepted as grpcio accepts them and mean nothing in process."""

    request_streaming = False

    def __init__(
        self,
        channel: FakeChannel,
        method: str,
        serialize: Serializer | None,
        deserialize: Deserializer | None,
    ) -> None:
        self._channel = channel
        self._method = method
        self._serialize = serialize or (lambda m: m)
        self._deserialize = deserialize

    def _start(
        self, request: Any, timeout: float | None, metadata: Any, streaming: bool
    ) -> _Call | FakeRpcError:
        if self.request_streaming:
            # A request stream is serialized as the servicer consumes it.
            requests: Iterator[bytes] = (self._serialize(r) for r in request)
        else:
            # A unary request is serialized here in the caller's thread, as grpcio does.
            requests = iter([self._serialize(request)])
        handler = self._channel.router.handler(self._channel.address, self._method)
        if isinstance(handler, Status):
            return _failed(handler)
        run = RpcRun(self._method, handler, requests, as_metadata(metadata), timeout)
        return _Call(run, self._deserialize, streaming)


class _UnaryResponse(_MultiCallable):
    def __call__(
        self, request: Any, timeout: float | None = None, metadata: Any = None, *_: Any, **__: Any
    ) -> Any:
        return self.with_call(request, timeout, metadata)[0]

    def with_call(
        self, request: Any, timeout: float | None = None, metadata: Any = None, *_: Any, **__: Any
    ) -> tuple[Any, grpc.Call]:
        call = self._start(request, timeout, metadata, streaming=False)
        if isinstance(call, FakeRpcError):
            raise call
        return call._unary_result(), call

    def future(
        self, request: Any, timeout: float | None = None, metadata: Any = None, *_: Any, **__: Any
    ) -> Any:
        return self._start(request, timeout, metadata, streaming=False)


class _StreamResponse(_MultiCallable):
    def __call__(
        self, request: Any, timeout: float | None = None, metadata: Any = None, *_: Any, **__: Any
    ) -> Any:
        return self._start(request, timeout, metadata, streaming=True)


class _UnaryUnary(_UnaryResponse, grpc.UnaryUnaryMultiCallable):  # type: ignore[misc,type-arg]
    pass


class _UnaryStream(_StreamResponse, grpc.UnaryStreamMultiCallable):  # type: ignore[misc,type-arg]
    pass


class _StreamUnary(_UnaryResponse, grpc.StreamUnaryMultiCallable):  # type: ignore[misc,type-arg]
    request_streaming = True


class _StreamStream(_StreamResponse, grpc.StreamStreamMultiCallable):  # type: ignore[misc,type-arg]
    request_streaming = True


class FakeChannel(ChannelFactories, grpc.Channel):  # type: ignore[misc]
    """A sync channel to one of the fake's addresses."""

    kinds = {
        "unary_unary": _UnaryUnary,
        "unary_stream": _UnaryStream,
        "stream_unary": _StreamUnary,
        "stream_stream": _StreamStream,
    }

    def __init__(self, router: Router, address: str) -> None:
        self.router = router
        self.address = address
        self.closed = False

    def subscribe(self, callback: Callable[..., None], try_to_connect: bool = False) -> None:
        callback(grpc.ChannelConnectivity.READY)

    def unsubscribe(self, callback: Callable[..., None]) -> None:
        pass

    def close(self) -> None:
        self.closed = True

    def __enter__(self) -> FakeChannel:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
