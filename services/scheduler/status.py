"""Turning exceptions into gRPC statuses at the servicer edge (once, in one place).

A :class:`ServiceError` becomes its status code and message plus the
``orchard-reason`` / ``orchard-fault`` trailing metadata. Anything else is a
bug or an outage on our side: it is logged with its traceback and reported as
INTERNAL with fault ``infrastructure`` so trainers drop the sample instead of
blaming the task.
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import grpc
import structlog

from orchard.common.errors import ServiceError

from .disk_full import disk_full_error, is_disk_full

log = structlog.get_logger("orchard.scheduler")

Req = TypeVar("Req")
Resp = TypeVar("Resp")
Self = TypeVar("Self")
Handler = Callable[[Self, Req, grpc.aio.ServicerContext[Any, Any]], Awaitable[Resp]]


async def abort_with(context: grpc.aio.ServicerContext[Any, Any], error: ServiceError) -> None:
    context.set_trailing_metadata(error.trailing_metadata())
    await context.abort(error.code, error.message)


def reports_errors(method: Handler[Self, Req, Resp]) -> Handler[Self, Req, Resp]:
    """Wrap a grpc.aio unary handler so errors leave as statuses with reason and fault."""

    @functools.wraps(method)
    async def wrapper(
        self: Self, request: Req, context: grpc.aio.ServicerContext[Any, Any]
    ) -> Resp:
        try:
            return await method(self, request, context)
        except ServiceError as exc:
            await abort_with(context, exc)
        except grpc.aio.AbortError:
            raise
        except Exception as exc:
            if is_disk_full(exc):
                log.error("disk full", rpc=method.__name__, error=str(exc))
                await abort_with(context, disk_full_error(str(exc)))
            log.exception("unexpected error", rpc=method.__name__)
            await abort_with(
                context,
                ServiceError(
                    grpc.StatusCode.INTERNAL,
                    "BACKEND_FAILURE",
                    "internal error in the scheduler",
                    "infrastructure",
                ),
            )
        raise AssertionError("unreachable: context.abort raises")

    return wrapper
