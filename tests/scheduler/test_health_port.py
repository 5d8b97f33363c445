"""The scheduler's health-only port: what the kubelet's gRPC probe asks, in plaintext.

A real scheduler (STAND-IN backend ``EnvFakeBackend``, as the other pool tests) with
``health_listen``: its own port speaks only mutual TLS, the health-only port answers
``grpc.health.v1`` in plaintext with the same servicer, and serves nothing else.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from orchard._proto.orchard.v1 import sandbox_pb2, sandbox_pb2_grpc

from .conftest import EnvFakeBackend, pool_settings, start_pool_plane


def test_the_health_port_answers_in_plaintext_and_serves_nothing_else(tmp_path: Path) -> None:
    plane = start_pool_plane(
        tmp_path,
        EnvFakeBackend(),
        make_settings=lambda home: replace(pool_settings(home), health_listen="127.0.0.1:0"),
    )
    try:
        health_port = plane.scheduler.health_port
        assert health_port is not None
        with grpc.insecure_channel(health_port.address) as channel:
            answer = health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(service="orchard.v1.SandboxService"), timeout=10
            )
            assert answer.status == health_pb2.HealthCheckResponse.SERVING
            with pytest.raises(grpc.RpcError) as other:
                sandbox_pb2_grpc.SandboxServiceStub(channel).ListSandboxes(
                    sandbox_pb2.ListSandboxesRequest(),
                    metadata=(("orchard-tenant", "alice"),),
                    timeout=10,
                )
            assert other.value.code() == grpc.StatusCode.UNIMPLEMENTED  # type: ignore[attr-defined]
        # The scheduler's own port refuses the same plaintext caller at the handshake.
        with grpc.insecure_channel(plane.scheduler.address) as channel:
            with pytest.raises(grpc.RpcError) as refused:
                health_pb2_grpc.HealthStub(channel).Check(
                    health_pb2.HealthCheckRequest(), timeout=5
                )
            assert refused.value.code() == grpc.StatusCode.UNAVAILABLE  # type: ignore[attr-defined]
    finally:
        plane.stop()
        plane.loop.close()
