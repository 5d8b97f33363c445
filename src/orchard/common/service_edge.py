"""Where an exception raised by a handler becomes a gRPC status: once, for every service.

A :class:`~orchard.common.errors.ServiceError` leaves as its code and message
plus the ``orchard-reason`` / ``orchard-fault`` (and ``retry-after``) trailing
metadata the SDK reads into its exception tree. A :class:`PassedOnStatus` (a
status another Orchard service answered, which a gateway or proxy hands on)
leaves unchanged. Anything else is a bug or an outage on our side: it is
logged with its traceback and leaves as INTERNAL, reason ``BACKEND_FAILURE``,
fault ``infrastructure``, so the client never sees a Python error text and a
trainer drops the sample instead of blaming the task.

Why a server interceptor (:class:`ServiceErrors`) rather than a decorator on
each servicer method: it is installed once per server by
:class:`~orchard.common.service_runner.ServiceRunner`, so it covers every
method of every servicer on that server, generated (``add_*Servicer_to_server``)
or descriptor-driven (the gateway's generic handlers), and a method added
later cannot forget it; a decorator has to be remembered on each method (the
rewards service had none, so its errors carried no fault). Handlers that run
outside the server's interceptors on purpose (the gateway's byte-forwarding
proxy) are wrapped with :func:`with_service_errors`, the same code.

Every handler shape grpc.aio accepts keeps its shape, because grpc.aio picks
how to run a handler by it: coroutine functions (unary, and the reader/writer
API of streams, e.g. the health service's ``Watch``), async generators, and
the sync forms (a plain function, or one returning an iterator), which grpc.aio
runs in its thread pool with a sync context (there the status is set, not
aborted: see :meth:`_Edge.fail_sync`).
"""

from __future__ import annotations

import inspect
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any, NoReturn

import grpc
import structlog

from .errors import FAULT_KEY, REASON_KEY, RETRY_AFTER_KEY, ServiceError

log = structlog.get_logger("orchard.service_edge")

PASSED_TRAILERS = (REASON_KEY, FAULT_KEY, RETRY_AFTER_KEY)
"""The trailing metadata a status keeps when it is passed on from one service to the caller."""

Translate = Callable[[Exception], ServiceError | None]
"""A service's own mapping of an unexpected exception to a status (None: not one it knows)."""


class PassedOnStatus(Exception):
    """Another service's status, handed to our caller as it came: code, message, Orchard trailers."""

    def __init__(
        self, code: grpc.StatusCode, message: str, trailers: tuple[tuple[str, str], ...]
    ) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.trailers = trailers

    @classmethod
    def of(cls, exc: grpc.aio.AioRpcError, empty_message: str = "") -> PassedOnStatus:
        """``exc``'s status (``empty_message`` if it came without one)."""
        # grpc.aio metadata iterates as (key, value) pairs; the stubs say otherwise.
        received: Any = exc.trailing_metadata() or ()
        trailers = tuple((str(k), str(v)) for k, v in received if k in PASSED_TRAILERS)
        return cls(exc.code(), exc.details() or empty_message, trailers)


def _status_of(
    exc: Exception, service: str, method: str, translate: Translate | None
) -> tuple[grpc.StatusCode, str, tuple[tuple[str, str], ...]]:
    if isinstance(exc, ServiceError):
        return exc.code, exc.message, exc.trailing_metadata()
    if isinstance(exc, PassedOnStatus):
        return exc.code, exc.message, exc.trailers
    known = translate(exc) if translate is not None else None
    if known is not None:
        log.error("failure", service=service, rpc=method, error=str(exc))
        return known.code, known.message, known.trailing_metadata()
    log.exception("unexpected error", service=service, rpc=method, error=str(exc))
    unexpected = ServiceError(
        grpc.StatusCode.INTERNAL,
        "BACKEND_FAILURE",
        f"the {service} failed unexpectedly; see its log",
        fault="infrastructure",
    )
    return unexpected.code, unexpected.message, unexpected.trailing_metadata()


async def abort_with(context: grpc.aio.ServicerContext[Any, Any], error: ServiceError) -> NoReturn:
    """End the call with ``error``'s status and trailers (for code that must abort itself)."""
    await context.abort(error.code, error.message, trailing_metadata=error.trailing_metadata())
    raise AssertionError("context.abort returned")  # pragma: no cover - abort raises


Authorize = Callable[[Any, str], object]
"""A server's caller check, run before each handler with its context and full method name
(``caller_policy.CallerPolicy.check``); it raises a ServiceError to refuse the call."""


class _Edge:
    """The wrappers for one method: each catches, maps (:func:`_status_of`) and aborts."""

    def __init__(
        self,
        service: str,
        method: str,
        translate: Translate | None,
        authorize: Authorize | None = None,
        full_method: str = "",
    ) -> None:
        self.service = service
        self.method = method
        self.translate = translate
        self.authorize = authorize
        self.full_method = full_method

    def admit(self, context: Any) -> None:
        """Refuse the call (a ServiceError) unless the server's caller check allows it."""
        if self.authorize is not None:
            self.authorize(context, self.full_method)

    async def abort(self, context: Any, exc: Exception) -> NoReturn:
        code, message, trailers = _status_of(exc, self.service, self.method, self.translate)
        await context.abort(code, message, trailing_metadata=trailers)
        raise AssertionError("context.abort returned")  # pragma: no cover - abort raises

    def fail_sync(self, context: Any, exc: Exception) -> None:
        # Not context.abort: grpc.aio's sync context runs it on the loop at once,
        # racing the writes of responses already yielded (the call then hangs).
        # Code, message and trailers set here are sent once the handler returns.
        code, message, trailers = _status_of(exc, self.service, self.method, self.translate)
        context.set_trailing_metadata(trailers)
        context.set_code(code)
        context.set_details(message)

    def single(self, inner: Callable[..., Any]) -> Callable[..., Any]:
        """A handler with one response (unary-unary, stream-unary)."""
        if inspect.iscoroutinefunction(inner):

            async def single_async(request: Any, context: Any) -> Any:
                try:
                    self.admit(context)
                    return await inner(request, context)
                except grpc.aio.AbortError:
                    raise
                except Exception as exc:
                    await self.abort(context, exc)

            return single_async

        def single_sync(request: Any, context: Any) -> Any:
            try:
                self.admit(context)
                return inner(request, context)
            except Exception as exc:
                self.fail_sync(context, exc)
                return None

        return single_sync

    def streaming(self, inner: Callable[..., Any]) -> Callable[..., Any]:
        """A handler with a response stream (unary-stream, stream-stream)."""
        if inspect.iscoroutinefunction(inner):  # the reader/writer API: writes, returns None

            async def writer(request: Any, context: Any) -> None:
                try:
                    self.admit(context)
                    await inner(request, context)
                except grpc.aio.AbortError:
                    raise
                except Exception as exc:
                    await self.abort(context, exc)

            return writer
        if inspect.isasyncgenfunction(inner):

            async def async_stream(request: Any, context: Any) -> AsyncIterator[Any]:
                try:
                    self.admit(context)
                    async for item in inner(request, context):
                        yield item
                except grpc.aio.AbortError:
                    raise
                except Exception as exc:
                    await self.abort(context, exc)

            return async_stream

        def sync_stream(request: Any, context: Any) -> Iterator[Any]:
            try:
                self.admit(context)
                yield from inner(request, context)
            except Exception as exc:
                self.fail_sync(context, exc)

        return sync_stream


def with_service_errors(
    handler: Any,
    service: str,
    method: str = "",
    translate: Translate | None = None,
    authorize: Authorize | None = None,
    full_method: str = "",
) -> Any:
    """``handler`` (a ``grpc.RpcMethodHandler``) whose exceptions leave as statuses with fault.

    ``service`` names the process in the message of an unexpected error (``the
    scheduler failed unexpectedly; see its log``); ``translate`` lets a service
    map failures it recognises (a full disk) to their own status; ``authorize`` (with the
    call's ``full_method``) refuses callers before the handler runs.
    """
    edge = _Edge(service, method, translate, authorize, full_method)
    deserialize, serialize = handler.request_deserializer, handler.response_serializer
    if handler.request_streaming and handler.response_streaming:
        return grpc.stream_stream_rpc_method_handler(
            edge.streaming(handler.stream_stream), deserialize, serialize
        )
    if handler.request_streaming:
        return grpc.stream_unary_rpc_method_handler(
            edge.single(handler.stream_unary), deserialize, serialize
        )
    if handler.response_streaming:
        return grpc.unary_stream_rpc_method_handler(
            edge.streaming(handler.unary_stream), deserialize, serialize
        )
    return grpc.unary_unary_rpc_method_handler(
        edge.single(handler.unary_unary), deserialize, serialize
    )


class ServiceErrors(grpc.aio.ServerInterceptor):  # type: ignore[type-arg]
    """The server interceptor that applies :func:`with_service_errors` to every method.

    Put it last in the server's list (closest to the servicer), so the
    interceptors before it (metrics, spans) see the status it sets, not the
    exception. ``authorize`` (an internal service's ``CallerPolicy.check``) runs
    first in every call, so its refusal is a status like any other.
    """

    def __init__(
        self,
        service: str,
        translate: Translate | None = None,
        authorize: Authorize | None = None,
    ) -> None:
        self.service = service
        self.translate = translate
        self.authorize = authorize
        self._wrapped: dict[str, tuple[Any, Any]] = {}

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Any],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> Any:
        handler = await continuation(handler_call_details)
        if handler is None:
            return None
        # Handlers are fixed objects per method: wrap each once, not per call.
        method = handler_call_details.method
        cached = self._wrapped.get(method)
        if cached is not None and cached[0] is handler:
            return cached[1]
        wrapped = with_service_errors(
            handler,
            self.service,
            method.rsplit("/", 1)[-1],
            self.translate,
            self.authorize,
            method,
        )
        self._wrapped[method] = (handler, wrapped)
        return wrapped
