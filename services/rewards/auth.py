"""Callers authenticate with their Orchard API key; the gateway is the judge of it.

The rewards service keeps no keys: it asks the gateway (``ListImages`` with
the caller's key, answer cached for a minute by the key's hash), and Grade
creates its sandboxes with that same key, so they count against the caller's
quotas and belong to the caller's tenant.
"""

from __future__ import annotations

import hashlib
import time
from typing import Any

import grpc

from orchard._proto.orchard.v1 import sandbox_pb2, sandbox_pb2_grpc
from orchard.common.errors import infrastructure, unauthenticated
from orchard.common.service_edge import PassedOnStatus


class KeyCheck:
    def __init__(self, channel: grpc.aio.Channel, ttl_seconds: float) -> None:
        self._stub = sandbox_pb2_grpc.SandboxServiceStub(channel)
        self._ttl = ttl_seconds
        self._accepted: dict[str, float] = {}

    async def require(self, context: grpc.aio.ServicerContext[Any, Any]) -> str:
        """The caller's API key, accepted by the gateway; a ServiceError otherwise."""
        metadata = dict(context.invocation_metadata() or ())
        header = str(metadata.get("authorization", ""))
        if not header.lower().startswith("bearer ") or not header[7:].strip():
            raise unauthenticated("missing 'authorization: Bearer <API key>'", "API_KEY_INVALID")
        key = header[7:].strip()
        digest = hashlib.sha256(key.encode()).hexdigest()
        now = time.monotonic()
        if self._accepted.get(digest, 0.0) > now:
            return key
        try:
            await self._stub.ListImages(
                sandbox_pb2.ListImagesRequest(),
                metadata=(("authorization", f"Bearer {key}"),),
                timeout=10,
            )
        except grpc.aio.AioRpcError as exc:
            if exc.code() in (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED):
                raise PassedOnStatus.of(exc, "API key refused") from None
            raise infrastructure(f"cannot check the API key: gateway {exc.code().name}") from None
        self._accepted[digest] = now + self._ttl
        return key
