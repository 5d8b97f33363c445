"""Requests whose bytes do not parse answer INVALID_ARGUMENT, not UNKNOWN.

grpc.aio runs the request deserializer (``Message.FromString``) before any
servicer code; when it raises (random bytes, a truncated message, invalid
UTF-8 in a string field, a varint longer than 10 bytes) the call ends with
``UNKNOWN: Unexpected <class 'DecodeError'>``, which tells a client nothing
about whose fault it was and looks like a server crash. :class:`UndecodableRequests`
swaps each handler's deserializer for one that returns an :class:`Undecodable`
marker instead of raising, and aborts the call with INVALID_ARGUMENT (reason
INVALID_FIELD, fault client: :func:`~orchard.common.service_edge.abort_with`)
when the servicer would have received it (the first message of a unary call,
or any message of a request stream). Put it first in a server's interceptor list so
no other interceptor or servicer ever sees the marker.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, NoReturn

import grpc

from .errors import invalid
from .service_edge import abort_with


class Undecodable:
    """What a request deserializer returns instead of raising on bytes that do not parse."""

    __slots__ = ("error", "size")

    def __init__(self, error: Exception, size: int) -> None:
        self.error = error
        self.size = size

    @property
    def message(self) -> str:
        return f"request message does not parse ({self.size} bytes): {str(self.error)[:200]}"


def _lenient(deserializer: Callable[[bytes], Any] | None) -> Callable[[bytes], Any] | None:
    if deserializer is None:
        return None

    def deserialize(data: bytes) -> Any:
        try:
            return deserializer(data)
        except Exception as exc:  # DecodeError, RuntimeWarning-as-error, UnicodeDecodeError
            return Undecodable(exc, len(data))

    return deserialize


async def _refuse(context: grpc.aio.ServicerContext[Any, Any], bad: Undecodable) -> NoReturn:
    await abort_with(context, invalid(bad.message))


async def _checked(
    requests: AsyncIterator[Any], context: grpc.aio.ServicerContext[Any, Any]
) -> AsyncIterator[Any]:
    async for request in requests:
        if isinstance(request, Undecodable):
            await _refuse(context, request)
        yield request


def _wrap(handler: Any) -> Any:
    deserializer = _lenient(handler.request_deserializer)
    serializer = handler.response_serializer
    if not handler.request_streaming and not handler.response_streaming:
        inner_uu = handler.unary_unary

        async def unary_unary(request: Any, context: Any) -> Any:
            if isinstance(request, Undecodable):
                await _refuse(context, request)
            return await inner_uu(request, context)

        return grpc.unary_unary_rpc_method_handler(unary_unary, deserializer, serializer)
    if not handler.request_streaming and handler.response_streaming:
        inner_us = handler.unary_stream

        async def unary_stream(request: Any, context: Any) -> AsyncIterator[Any]:
            if isinstance(request, Undecodable):
                await _refuse(context, request)
            async for item in inner_us(request, context):
                yield item

        return grpc.unary_stream_rpc_method_handler(unary_stream, deserializer, serializer)
    if handler.request_streaming and not handler.response_streaming:
        inner_su = handler.stream_unary

        async def stream_unary(requests: Any, context: Any) -> Any:
            return await inner_su(_checked(requests, context), context)

        return grpc.stream_unary_rpc_method_handler(stream_unary, deserializer, serializer)
    inner_ss = handler.stream_stream

    async def stream_stream(requests: Any, context: Any) -> AsyncIterator[Any]:
        async for item in inner_ss(_checked(requests, context), context):
            yield item

    return grpc.stream_stream_rpc_method_handler(stream_stream, deserializer, serializer)


class UndecodableRequests(grpc.aio.ServerInterceptor):  # type: ignore[type-arg]
    """INVALID_ARGUMENT with a message for request bytes that do not parse (see the module doc)."""

    def __init__(self) -> None:
        self._wrapped: dict[str, tuple[Any, Any]] = {}

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[Any]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> Any:
        handler = await continuation(handler_call_details)
        if handler is None:
            return None
        # Handlers are fixed objects per method: wrap each once, not per call.
        cached = self._wrapped.get(handler_call_details.method)
        if cached is not None and cached[0] is handler:
            return cached[1]
        wrapped = _wrap(handler)
        self._wrapped[handler_call_details.method] = (handler, wrapped)
        return wrapped
