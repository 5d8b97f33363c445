"""GatewayService: authenticate, then forward SandboxService calls to the scheduler.

Errors from the scheduler pass through unchanged (status, message and the
``orchard-reason`` / ``orchard-fault`` trailers); a scheduler that cannot be
reached is UNAVAILABLE with fault ``infrastructure``. The caller's deadline is
forwarded, so a call never outlives its client.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import grpc
import structlog
from google.protobuf.message import Message

from orchard._proto.orchard.v1 import pools_pb2, pools_pb2_grpc, sandbox_pb2, sandbox_pb2_grpc
from orchard.common.errors import FAULT_KEY, REASON_KEY, ServiceError

from .auth import ApiKeyAuth

log = structlog.get_logger("orchard.gateway")

TENANT_KEY = "orchard-tenant"
Context = grpc.aio.ServicerContext[Any, Any]
Req = TypeVar("Req", bound=Message)
Resp = TypeVar("Resp", bound=Message)


def _pairs(metadata: Any) -> list[tuple[str, str]]:
    """grpc.aio metadata as (key, value) pairs (it iterates as tuples; the stubs say otherwise)."""
    return [(str(k), str(v)) for k, v in (metadata or ())]


class GatewayService(sandbox_pb2_grpc.SandboxServiceServicer):
    def __init__(self, auth: ApiKeyAuth, scheduler: grpc.aio.Channel) -> None:
        self.auth = auth
        self.stub = sandbox_pb2_grpc.SandboxServiceStub(scheduler)

    async def _forward(
        self,
        call: Callable[..., Awaitable[Resp]],
        request: Message,
        context: Context,
    ) -> Resp:
        try:
            metadata = dict(_pairs(context.invocation_metadata()))
            authorization = metadata.get("authorization")
            tenant = self.auth.tenant_for(authorization)
        except ServiceError as exc:
            context.set_trailing_metadata(exc.trailing_metadata())
            await context.abort(exc.code, exc.message)
        remaining = context.time_remaining()
        try:
            return await call(request, metadata=((TENANT_KEY, tenant),), timeout=remaining)
        except grpc.aio.AioRpcError as exc:
            trailers = tuple(
                (k, v) for k, v in _pairs(exc.trailing_metadata()) if k in (REASON_KEY, FAULT_KEY)
            )
            if exc.code() == grpc.StatusCode.UNAVAILABLE and not trailers:
                log.warning("scheduler unavailable", error=exc.details())
                trailers = ((REASON_KEY, "BACKEND_FAILURE"), (FAULT_KEY, "infrastructure"))
                context.set_trailing_metadata(trailers)
                await context.abort(grpc.StatusCode.UNAVAILABLE, "the scheduler is unavailable")
            context.set_trailing_metadata(trailers)
            await context.abort(exc.code(), exc.details() or "")
        raise AssertionError("unreachable: context.abort raises")

    async def CreateSandbox(
        self, request: sandbox_pb2.CreateSandboxRequest, context: Context
    ) -> sandbox_pb2.Sandbox:
        return await self._forward(self.stub.CreateSandbox, request, context)

    async def GetSandbox(
        self, request: sandbox_pb2.GetSandboxRequest, context: Context
    ) -> sandbox_pb2.Sandbox:
        return await self._forward(self.stub.GetSandbox, request, context)

    async def ListSandboxes(
        self, request: sandbox_pb2.ListSandboxesRequest, context: Context
    ) -> sandbox_pb2.ListSandboxesResponse:
        return await self._forward(self.stub.ListSandboxes, request, context)

    async def DeleteSandbox(
        self, request: sandbox_pb2.DeleteSandboxRequest, context: Context
    ) -> sandbox_pb2.DeleteSandboxResponse:
        return await self._forward(self.stub.DeleteSandbox, request, context)

    async def GetExecutorAccess(
        self, request: sandbox_pb2.GetSandboxRequest, context: Context
    ) -> sandbox_pb2.ExecutorAccess:
        return await self._forward(self.stub.GetExecutorAccess, request, context)

    async def ListImages(
        self, request: sandbox_pb2.ListImagesRequest, context: Context
    ) -> sandbox_pb2.ListImagesResponse:
        return await self._forward(self.stub.ListImages, request, context)

    async def KeepAlive(
        self, request: sandbox_pb2.KeepAliveRequest, context: Context
    ) -> sandbox_pb2.Sandbox:
        return await self._forward(self.stub.KeepAlive, request, context)


class GatewayPoolService(pools_pb2_grpc.PoolServiceServicer):
    """PoolService (list pools, demand hints), forwarded like the sandbox calls."""

    def __init__(self, sandboxes: GatewayService, scheduler: grpc.aio.Channel) -> None:
        self.sandboxes = sandboxes
        self.stub = pools_pb2_grpc.PoolServiceStub(scheduler)

    async def ListPools(
        self, request: pools_pb2.ListPoolsRequest, context: Context
    ) -> pools_pb2.ListPoolsResponse:
        return await self.sandboxes._forward(self.stub.ListPools, request, context)

    async def Hint(self, request: pools_pb2.DemandHint, context: Context) -> pools_pb2.HintResponse:
        return await self.sandboxes._forward(self.stub.Hint, request, context)
