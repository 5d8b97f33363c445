"""Where a ServiceError becomes a gRPC status, in one place.

Every servicer method is wrapped by :func:`unary` or :func:`streaming`: a
:class:`ServiceError` aborts the call with its code, message and the
``orchard-reason`` / ``orchard-fault`` trailing metadata; anything else is a
bug, logged with its traceback and reported as INTERNAL (fault
infrastructure) rather than leaking a Python error text.
"""

from __future__ import annotations

import functools
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, NoReturn, TypeVar

import grpc
import structlog

from orchard.common.errors import ServiceError

log = structlog.get_logger("orchard.executor")

Req = TypeVar("Req")
Resp = TypeVar("Resp")
Self = TypeVar("Self")


async def abort_with(context: grpc.aio.ServicerContext[Any, Any], error: ServiceError) -> NoReturn:
    await context.abort(error.code, error.message, trailing_metadata=error.trailing_metadata())
    raise AssertionError("context.abort returned")  # pragma: no cover


async def _abort_unexpected(
    context: grpc.aio.ServicerContext[Any, Any], method: str, exc: Exception
) -> NoReturn:
    log.exception("unexpected error", method=method, error=str(exc))
    await abort_with(
        context,
        ServiceError(
            grpc.StatusCode.INTERNAL,
            "BACKEND_FAILURE",
            "the executor failed unexpectedly; see its log",
            fault="infrastructure",
        ),
    )


def unary(
    fn: Callable[[Self, Req, grpc.aio.ServicerContext[Any, Any]], Awaitable[Resp]],
) -> Callable[[Self, Req, grpc.aio.ServicerContext[Any, Any]], Awaitable[Resp]]:
    @functools.wraps(fn)
    async def wrapper(
        self: Self, request: Req, context: grpc.aio.ServicerContext[Any, Any]
    ) -> Resp:
        try:
            return await fn(self, request, context)
        except ServiceError as exc:
            await abort_with(context, exc)
        except grpc.aio.AbortError:
            raise
        except Exception as exc:
            await _abort_unexpected(context, fn.__name__, exc)

    return wrapper


def streaming(
    fn: Callable[[Self, Req, grpc.aio.ServicerContext[Any, Any]], AsyncIterator[Resp]],
) -> Callable[[Self, Req, grpc.aio.ServicerContext[Any, Any]], AsyncIterator[Resp]]:
    @functools.wraps(fn)
    async def wrapper(
        self: Self, request: Req, context: grpc.aio.ServicerContext[Any, Any]
    ) -> AsyncIterator[Resp]:
        try:
            async for item in fn(self, request, context):
                yield item
        except ServiceError as exc:
            await abort_with(context, exc)
        except grpc.aio.AbortError:
            raise
        except Exception as exc:
            await _abort_unexpected(context, fn.__name__, exc)

    return wrapper
