"""A plaintext port that serves only ``grpc.health.v1``, for probes that cannot speak TLS.

The kubelet's native gRPC probe dials in plaintext and a TLS service's own port
refuses that, so a TLS service would otherwise be probed by a TCP connect, which
says nothing about readiness (a process that accepts but is NOT_SERVING, or
stopping, looks healthy). This second server shares the service's own
:class:`HealthServicer`, so it answers exactly what the service's port would:
NOT_SERVING until ready, SERVING, NOT_SERVING while stopping. It serves no other
method, so reaching it gives nothing but that status.
"""

from __future__ import annotations

from dataclasses import dataclass

import grpc
from grpc_health.v1 import health_pb2_grpc

from .address_file import public_address


@dataclass
class HealthPort:
    server: grpc.aio.Server
    address: str

    async def stop(self) -> None:
        await self.server.stop(None)


async def start_health_port(health: health_pb2_grpc.HealthServicer, listen: str) -> HealthPort:
    """Serve ``health`` alone, in plaintext, on ``listen`` ("host:port"; port 0 = a free one)."""
    server = grpc.aio.server()
    health_pb2_grpc.add_HealthServicer_to_server(health, server)
    port = server.add_insecure_port(listen)
    if port == 0:
        raise OSError(f"cannot listen on {listen} for the health port")
    await server.start()
    return HealthPort(server, public_address(listen, port))
