"""Tenants prove who they are with their Orchard API key; the gateway is the judge of it.

The proxy keeps no keys (so a revoked or rotated key, or a tenant added on another replica,
counts at once): it asks the gateway ``GetTenant`` with the caller's key over gRPC (the
services talk only through ``protos/``), and caches the answer (tenant name) for a minute by
the key's sha256. The gateway's UNAUTHENTICATED/PERMISSION_DENIED become 401; a gateway that
cannot answer becomes 503, never an open door.
"""

from __future__ import annotations

import hashlib
import time

import grpc

from orchard._proto.orchard.v1 import sandbox_pb2, sandbox_pb2_grpc

from .errors import ProxyError


class TenantKeys:
    def __init__(self, channel: grpc.aio.Channel, ttl_seconds: float) -> None:
        self._stub = sandbox_pb2_grpc.SandboxServiceStub(channel)
        self._ttl = ttl_seconds
        self._accepted: dict[str, tuple[str, float]] = {}

    async def tenant_of(self, authorization: str | None) -> str:
        """The tenant whose API key is in ``authorization`` (``Bearer <key>``); else ProxyError."""
        scheme, _, key = (authorization or "").partition(" ")
        key = key.strip()
        if scheme.lower() != "bearer" or not key:
            raise ProxyError(401, "API_KEY_MISSING", "send 'Authorization: Bearer <API key>'")
        digest = hashlib.sha256(key.encode()).hexdigest()
        now = time.monotonic()
        cached = self._accepted.get(digest)
        if cached is not None and cached[1] > now:
            return cached[0]
        try:
            view = await self._stub.GetTenant(
                sandbox_pb2.GetTenantRequest(),
                metadata=(("authorization", f"Bearer {key}"),),
                timeout=10,
            )
        except grpc.aio.AioRpcError as exc:
            if exc.code() in (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED):
                raise ProxyError(401, "API_KEY_INVALID", "API key refused by the gateway") from None
            raise ProxyError(
                503, "GATEWAY_UNAVAILABLE", f"cannot check the API key: gateway {exc.code().name}"
            ) from None
        if not view.tenant:
            raise ProxyError(503, "GATEWAY_UNAVAILABLE", "the gateway named no tenant for the key")
        if len(self._accepted) > 10_000:
            self._accepted.clear()  # bounded: a flood of distinct keys cannot grow it
        self._accepted[digest] = (view.tenant, now + self._ttl)
        return view.tenant
