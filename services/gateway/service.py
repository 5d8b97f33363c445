"""GatewayService: authenticate, admit, then forward control-plane calls to the scheduler.

The handlers are derived from the service descriptors in protos/ (every
unary method of ``orchard.v1.SandboxService``, and of any other service
passed to :func:`forwarding_handler`), so an RPC added to the proto is served
here without a line of gateway code. Each call:

1. checks the API key (``auth.ApiKeyAuth``) -> tenant, bound to the call's logs;
2. for CreateSandbox only: the tenant's create-rate bucket, then a slot of the
   fair create queue (``admission``); over the rate -> RESOURCE_EXHAUSTED with a
   ``retry-after`` hint;
3. forwards to the scheduler with ``orchard-tenant`` and ``orchard-quota``
   metadata (the scheduler enforces the sandbox/cpu/memory totals and puts
   the exec quota into the data-plane token) and the caller's deadline.

Errors from the scheduler pass through unchanged (status, message and the
``orchard-reason`` / ``orchard-fault`` / ``retry-after`` trailers, as a
:class:`~orchard.common.service_edge.PassedOnStatus`); a scheduler that cannot
be reached is UNAVAILABLE with fault ``infrastructure``. Every error leaves
through the server's one service edge.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import Any

import grpc
import structlog
from google.protobuf import message_factory
from google.protobuf.descriptor import MethodDescriptor, ServiceDescriptor
from google.protobuf.message import Message

from orchard._proto.orchard.v1 import sandbox_pb2
from orchard.common.errors import REASON_KEY, ServiceError
from orchard.common.logging import bind_call
from orchard.common.metrics import count_quota_rejection, observe_phase
from orchard.common.quotas import QUOTA_KEY, Quota, QuotaFile
from orchard.common.service_edge import PassedOnStatus

from .admission import FairCreateQueue, RateLimiter
from .auth import ApiKeyAuth

log = structlog.get_logger("orchard.gateway")

TENANT_KEY = "orchard-tenant"
SANDBOX_SERVICE = sandbox_pb2.DESCRIPTOR.services_by_name["SandboxService"]
Context = grpc.aio.ServicerContext[Any, Any]


def _pairs(metadata: Any) -> list[tuple[str, str]]:
    """grpc.aio metadata as (key, value) pairs (it iterates as tuples; the stubs say otherwise)."""
    return [(str(k), str(v)) for k, v in (metadata or ())]


def message_class(descriptor: Any) -> type[Message]:
    cls: type[Message] = message_factory.GetMessageClass(descriptor)
    return cls


class GatewayService:
    """The gateway's control-plane front: auth, quotas, fair admission, forwarding."""

    def __init__(
        self,
        auth: ApiKeyAuth,
        scheduler: grpc.aio.Channel,
        quotas: QuotaFile,
        create_slots: int = 8,
    ) -> None:
        self.auth = auth
        self.channel = scheduler
        self.quotas = quotas
        self.rates = RateLimiter()
        self.create_queue = FairCreateQueue(create_slots)
        self._calls: dict[str, Callable[..., Any]] = {}
        self._quota_error_logged = ""

    # ---- per call ---------------------------------------------------------------

    def caller(self, context: Context) -> tuple[str, Quota]:
        """The tenant whose API key the call carries, and its quota (ServiceError if refused)."""
        metadata = dict(_pairs(context.invocation_metadata()))
        tenant = self.auth.tenant_for(metadata.get("authorization"))
        bind_call(tenant=tenant)
        quota = self.quotas.for_tenant(tenant)
        if self.quotas.error and self.quotas.error != self._quota_error_logged:
            self._quota_error_logged = self.quotas.error
            log.error(
                "quotas.json is invalid; keeping the last good quotas", error=self.quotas.error
            )
        return tenant, quota

    def _upstream(self, full_method: str, response_cls: type[Message]) -> Callable[..., Any]:
        call = self._calls.get(full_method)
        if call is None:
            call = self._calls[full_method] = self.channel.unary_unary(
                full_method,
                request_serializer=lambda m: m.SerializeToString(),
                response_deserializer=response_cls.FromString,
            )
        return call

    async def forward(
        self,
        full_method: str,
        response_cls: type[Message],
        request: Message,
        context: Context,
        tenant: str,
        quota: Quota,
    ) -> Message:
        metadata = ((TENANT_KEY, tenant), (QUOTA_KEY, quota.to_metadata()))
        try:
            response: Message = await self._upstream(full_method, response_cls)(
                request, metadata=metadata, timeout=context.time_remaining()
            )
            return response
        except grpc.aio.AioRpcError as exc:
            passed = PassedOnStatus.of(exc)
            if passed.code == grpc.StatusCode.UNAVAILABLE and not passed.trailers:
                log.warning("scheduler unavailable", error=exc.details())
                raise ServiceError(
                    grpc.StatusCode.UNAVAILABLE,
                    "BACKEND_FAILURE",
                    "the scheduler is unavailable",
                    "infrastructure",
                ) from None
            if passed.code == grpc.StatusCode.RESOURCE_EXHAUSTED:
                count_quota_rejection(
                    "scheduler", tenant, dict(passed.trailers).get(REASON_KEY, "")
                )
            raise passed from None

    async def create(
        self,
        full_method: str,
        response_cls: type[Message],
        request: Message,
        context: Context,
        tenant: str,
        quota: Quota,
    ) -> Message:
        """CreateSandbox: rate bucket, fair queue, then forward; records queue and ready times."""
        started = time.monotonic()
        refused = self.rates.take(tenant, quota)
        if refused is not None:
            count_quota_rejection("gateway", tenant, "create_rate")
            raise refused
        async with self.create_queue.slot(tenant) as waited:
            observe_phase("queue", waited)
            response = await self.forward(
                full_method, response_cls, request, context, tenant, quota
            )
        observe_phase("ready", time.monotonic() - started)
        return response

    def handler_for(self, method: MethodDescriptor) -> Callable[[Message, Context], Awaitable[Any]]:
        full_method = f"/{method.containing_service.full_name}/{method.name}"
        response_cls = message_class(method.output_type)
        step = (
            self.create
            if method.full_name == "orchard.v1.SandboxService.CreateSandbox"
            else self.forward
        )

        async def handle(request: Message, context: Context) -> Message:
            tenant, quota = self.caller(context)
            return await step(full_method, response_cls, request, context, tenant, quota)

        return handle


def forwarding_handler(
    gateway: GatewayService, service: ServiceDescriptor = SANDBOX_SERVICE
) -> grpc.GenericRpcHandler:  # type: ignore[type-arg]
    """gRPC handlers for every unary method of ``service``, derived from its descriptor."""
    handlers: dict[str, grpc.RpcMethodHandler[Any, Any]] = {}
    for method in service.methods:
        if method.client_streaming or method.server_streaming:
            log.warning("not forwarding a streaming method", method=method.full_name)
            continue
        request_cls = message_class(method.input_type)
        handlers[method.name] = grpc.unary_unary_rpc_method_handler(
            gateway.handler_for(method),
            request_deserializer=request_cls.FromString,
            response_serializer=lambda m: m.SerializeToString(),
        )
    return grpc.method_handlers_generic_handler(service.full_name, handlers)
