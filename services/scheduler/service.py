"""The scheduler's SandboxService servicer (internal: only the gateway calls it).

Only the gateway can: the server admits its internal certificate alone (mutual TLS,
``callers.py``), which is what makes the metadata below trustworthy.

The tenant comes from the ``orchard-tenant`` metadata the gateway sets after
checking the API key; every read and write is scoped to it, and another
tenant's sandbox answers NOT_FOUND exactly like an unknown id.
"""

from __future__ import annotations

import re
import time
from importlib.metadata import version as _package_version
from typing import Any

import grpc
from google.protobuf.timestamp_pb2 import Timestamp

from orchard._proto.orchard.v1 import common_pb2, sandbox_pb2, sandbox_pb2_grpc
from orchard.common.errors import (
    ServiceError,
    infrastructure,
    invalid,
    not_found,
    precondition,
    unauthenticated,
)
from orchard.common.layout import is_valid_sandbox_id
from orchard.common.logging import bind_call
from orchard.common.metrics import observe_phase

from .backends.base import (
    MODEL_ENDPOINT,
    MODEL_ENDPOINT_BASE,
    UPDATE_NETWORK,
    BackendError,
    supports,
)
from .lifecycle import SandboxLifecycle, failed_create_error, lease_end
from .network_policies import policy_from_proto, policy_to_proto
from .pool_filler import PoolFiller
from .store import USABLE_STATES, SandboxRecord, State
from .tenant_quota import COUNTED_STATES, call_quota, check_create_quota, remember_call_quota
from .validation import validate_create, validate_labels, validate_template_request

TENANT_KEY = "orchard-tenant"
SERVER_VERSION = _package_version("orchard-env")
TENANT_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")

Context = grpc.aio.ServicerContext[Any, Any]


def tenant_of(context: Context) -> str:
    """The calling tenant; also takes in its quota for this call (``tenant_quota``)."""
    metadata = context.invocation_metadata()
    for key, value in metadata or ():
        if key == TENANT_KEY and isinstance(value, str) and TENANT_RE.match(value):
            bind_call(tenant=value)
            remember_call_quota(metadata)
            return value
    raise unauthenticated(
        "missing or malformed orchard-tenant metadata (call the gateway, not the scheduler)",
        "API_KEY_INVALID",
    )


def checked_id(sandbox_id: str) -> str:
    if not sandbox_id:
        raise invalid("id: a sandbox id is required")
    if not is_valid_sandbox_id(sandbox_id):
        # Not a well-formed id, so it cannot name a sandbox: same answer as an unknown one.
        raise not_found(f"sandbox {sandbox_id[:80]!r} not found", "SANDBOX_NOT_FOUND")
    return sandbox_id


def _timestamp(seconds: float) -> Timestamp:
    ts = Timestamp()
    ts.FromNanoseconds(int(seconds * 1e9))
    return ts


def to_proto(
    rec: SandboxRecord, access: sandbox_pb2.ExecutorAccess | None = None
) -> sandbox_pb2.Sandbox:
    return sandbox_pb2.Sandbox(
        id=rec.id,
        image=rec.image,
        resources=common_pb2.Resources(
            cpu_millis=rec.cpu_millis, memory_bytes=rec.memory_bytes, pids=rec.pids
        ),
        network=common_pb2.NetworkPolicy(mode=rec.network_mode),  # type: ignore[arg-type]
        state=int(rec.state),  # type: ignore[arg-type]
        state_reason=rec.state_reason,
        labels=rec.labels,
        env=rec.env,
        created_at=_timestamp(rec.created_at),
        expires_at=_timestamp(rec.expires_at),
        executor=access,
        tenant=rec.tenant,
        template=rec.template,
        fault=rec.fault,
        ttl_seconds=rec.ttl_seconds,
        model_endpoint=MODEL_ENDPOINT_BASE if rec.model_endpoint else "",
        tool_layers=list(rec.tool_layers),
    )


class SchedulerService(sandbox_pb2_grpc.SandboxServiceServicer):
    def __init__(self, lifecycle: SandboxLifecycle, pools: PoolFiller) -> None:
        self.lifecycle = lifecycle
        self.pools = pools

    def _access(self, rec: SandboxRecord) -> sandbox_pb2.ExecutorAccess:
        address, token, expiry, tls = self.lifecycle.access(rec)
        return sandbox_pb2.ExecutorAccess(
            address=address, token=token, token_expires_at=_timestamp(expiry), tls=tls
        )

    def _answer(self, rec: SandboxRecord) -> sandbox_pb2.Sandbox:
        msg = to_proto(rec, self._access(rec) if rec.state in USABLE_STATES else None)
        return self._with_network(msg, rec)

    def _with_network(self, msg: sandbox_pb2.Sandbox, rec: SandboxRecord) -> sandbox_pb2.Sandbox:
        """``msg`` with the policy in force (the record holds only the create-time mode)."""
        policy = self.lifecycle.network_policies.get(rec.id, rec.network_mode)
        msg.network.CopyFrom(policy_to_proto(policy))
        return msg

    async def CreateSandbox(
        self, request: sandbox_pb2.CreateSandboxRequest, context: Context
    ) -> sandbox_pb2.Sandbox:
        tenant = tenant_of(context)
        if request.template:
            validate_template_request(request)
        validated = validate_create(request, self.lifecycle.settings.limits)
        if validated.model_endpoint:
            self._check_model_endpoint()
        sized = self.pools.pool(request.template).template if request.template else validated
        check_create_quota(
            self.lifecycle.store, tenant, sized.cpu_millis, sized.memory_bytes, validated.request_id
        )
        if request.template:
            claim_started = time.monotonic()
            rec = await self.pools.claim(tenant, validated, request.template)
            observe_phase("claim", time.monotonic() - claim_started)
        else:
            rec = await self.lifecycle.create(tenant, validated)
        if rec.state == State.FAILED:
            raise failed_create_error(rec)
        if rec.state not in USABLE_STATES:
            raise precondition(f"sandbox {rec.id} is {rec.state.name}", "SANDBOX_NOT_READY")
        return self._answer(rec)

    def _check_model_endpoint(self) -> None:
        """INVALID_ARGUMENT where sandboxes cannot have a model endpoint."""
        backend = supports(self.lifecycle.backend, MODEL_ENDPOINT)
        if backend is None:
            raise invalid(
                f"model_endpoint: the {self.lifecycle.backend.name} backend cannot give a "
                "sandbox a model endpoint (docs/model-endpoint.md)"
            )
        try:
            backend.check_model_endpoint("")
        except BackendError as exc:
            raise invalid(exc.message) from exc

    async def GetSandbox(
        self, request: sandbox_pb2.GetSandboxRequest, context: Context
    ) -> sandbox_pb2.Sandbox:
        rec = self.lifecycle.get(tenant_of(context), checked_id(request.id))
        return self._answer(rec)

    async def ListSandboxes(
        self, request: sandbox_pb2.ListSandboxesRequest, context: Context
    ) -> sandbox_pb2.ListSandboxesResponse:
        tenant = tenant_of(context)
        labels = validate_labels(dict(request.labels), self.lifecycle.settings.limits)
        records = self.lifecycle.store.find(tenant=tenant, labels=labels)
        return sandbox_pb2.ListSandboxesResponse(
            sandboxes=[self._with_network(to_proto(r), r) for r in records]
        )

    async def DeleteSandbox(
        self, request: sandbox_pb2.DeleteSandboxRequest, context: Context
    ) -> sandbox_pb2.DeleteSandboxResponse:
        await self.lifecycle.delete(tenant_of(context), checked_id(request.id))
        return sandbox_pb2.DeleteSandboxResponse()

    async def GetExecutorAccess(
        self, request: sandbox_pb2.GetSandboxRequest, context: Context
    ) -> sandbox_pb2.ExecutorAccess:
        rec = self.lifecycle.get(tenant_of(context), checked_id(request.id))
        if rec.state not in USABLE_STATES:
            raise precondition(
                f"sandbox {rec.id} is {rec.state.name}, not READY", "SANDBOX_NOT_READY"
            )
        return self._access(rec)

    async def KeepAlive(
        self, request: sandbox_pb2.KeepAliveRequest, context: Context
    ) -> sandbox_pb2.Sandbox:
        rec = self.lifecycle.get(tenant_of(context), checked_id(request.id))
        limits = self.lifecycle.settings.limits
        ttl = request.ttl_seconds or rec.ttl_seconds
        if not 1 <= ttl <= limits.max_ttl_seconds:
            raise invalid(
                f"ttl_seconds must be between 1 and {limits.max_ttl_seconds} (got {ttl}); "
                "0 means the sandbox's own ttl"
            )
        if rec.state not in USABLE_STATES:
            raise precondition(
                f"sandbox {rec.id} is {rec.state.name}; only a running sandbox has a lease",
                "SANDBOX_NOT_READY",
            )
        now = self.lifecycle.clock()
        extended = self.lifecycle.store.extend_lease(
            rec.id, lease_end(rec, ttl, now, limits.max_ttl_seconds)
        )
        if extended is None:  # deleted or reaped since the read above
            raise precondition(f"sandbox {rec.id} is no longer running", "SANDBOX_NOT_READY")
        return self._answer(extended)

    async def UpdateNetworkPolicy(
        self, request: sandbox_pb2.UpdateNetworkPolicyRequest, context: Context
    ) -> sandbox_pb2.Sandbox:
        rec = self.lifecycle.get(tenant_of(context), checked_id(request.id))
        policy = policy_from_proto(request.network)
        if rec.state not in USABLE_STATES or self.lifecycle.is_busy(rec.id):
            raise precondition(
                f"sandbox {rec.id} is {rec.state.name}; only a running sandbox's policy can change",
                "SANDBOX_NOT_READY",
            )
        backend = supports(self.lifecycle.backend, UPDATE_NETWORK)
        if backend is None:
            raise precondition(
                f"the {self.lifecycle.backend.name} backend cannot change a running sandbox's "
                "network policy",
                "INVALID_FIELD",
            )
        try:
            await backend.update_network(rec.id, policy)
        except BackendError as exc:
            if exc.reason == "SANDBOX_NOT_READY":
                raise precondition(exc.message, "SANDBOX_NOT_READY") from exc
            raise infrastructure(f"network policy of {rec.id}: {exc.message}") from exc
        self.lifecycle.network_policies.save(rec.id, policy)
        return self._answer(rec)

    async def ListImages(
        self, request: sandbox_pb2.ListImagesRequest, context: Context
    ) -> sandbox_pb2.ListImagesResponse:
        tenant_of(context)
        images = await self.lifecycle.backend.images()
        return sandbox_pb2.ListImagesResponse(
            images=[
                sandbox_pb2.Image(
                    name=i.name, size_bytes=i.size_bytes, layers=i.layers, is_default=i.is_default
                )
                for i in images
            ]
        )

    async def GetTenant(
        self, request: sandbox_pb2.GetTenantRequest, context: Context
    ) -> sandbox_pb2.TenantView:
        """The caller's own view: its quota (as the gateway sent it) and what it uses now."""
        tenant = tenant_of(context)
        quota = call_quota()
        live, cpu, memory = self.lifecycle.store.usage(tenant, COUNTED_STATES)
        return sandbox_pb2.TenantView(
            tenant=tenant,
            quota=sandbox_pb2.TenantQuota(
                max_sandboxes=quota.max_sandboxes,
                max_cpu_millis=quota.max_cpu_millis,
                max_memory_bytes=quota.max_memory_bytes,
                create_rate=quota.create_rate,
                create_burst=quota.create_burst,
                max_execs=quota.max_execs,
            ),
            usage=sandbox_pb2.TenantUsage(sandboxes=live, cpu_millis=cpu, memory_bytes=memory),
            server_version=SERVER_VERSION,
        )


__all__ = ["SchedulerService", "ServiceError", "tenant_of", "to_proto"]
