"""A stand-in for the gateway's ``GetTenant``: a real gRPC server on loopback with a key table.

The proxy asks the gateway who an API key belongs to; the whole gateway needs a running stack
(runc, the heavy lock), so these tests answer that one RPC from a table, over the same proto
and a real socket. ``test_stack_live.py`` runs the proxy against the real gateway of ``orchard up``.
"""

from __future__ import annotations

from collections.abc import Iterator
from concurrent import futures
from contextlib import contextmanager
from typing import Any

import grpc

from orchard._proto.orchard.v1 import sandbox_pb2, sandbox_pb2_grpc


class _Tenants(sandbox_pb2_grpc.SandboxServiceServicer):
    def __init__(self, keys: dict[str, str]) -> None:
        self.keys = keys
        self.calls = 0

    def GetTenant(self, request: Any, context: grpc.ServicerContext) -> sandbox_pb2.TenantView:
        self.calls += 1
        header = dict(context.invocation_metadata()).get("authorization", "")
        tenant = self.keys.get(str(header).removeprefix("Bearer "))
        if tenant is None:
            context.abort(grpc.StatusCode.UNAUTHENTICATED, "invalid API key")
        return sandbox_pb2.TenantView(tenant=tenant)


@contextmanager
def tenant_gateway(keys: dict[str, str]) -> Iterator[str]:
    """``host:port`` of a server that knows ``keys`` (API key -> tenant)."""
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    sandbox_pb2_grpc.add_SandboxServiceServicer_to_server(_Tenants(keys), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        yield f"127.0.0.1:{port}"
    finally:
        server.stop(None)
