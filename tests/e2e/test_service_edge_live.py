"""The service edge on a real ``orchard up`` (real processes, real sockets, runc).

Every gRPC service of the stack answers the standard ``grpc.health.v1`` check
SERVING, for the whole process and for each Orchard service it serves; and a
RewardService refusal reaches the SDK's ``Rewards`` with the reason and fault
its trailers carry (before the one service edge, the rewards service aborted
calls itself and sent no trailer).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from orchard import AuthenticationError, InvalidRequestError, Rewards
from orchard._proto.orchard.v1 import rewards_pb2, rewards_pb2_grpc
from orchard.common.internal_pki import InternalPKI
from tests.stack import REQUIRES_STACK, Stack, running_stack

pytestmark = REQUIRES_STACK

SAMPLES = Path(__file__).parents[2] / "recipes" / "swe" / "samples"
ROW = json.loads((SAMPLES / "instances.jsonl").read_text().splitlines()[0])

# The address file each node process writes, and the Orchard services it serves.
SERVICES = {
    "gateway.addr": ("orchard.v1.SandboxService", "orchard.v1.PoolService"),
    "scheduler.addr": ("orchard.v1.SandboxService", "orchard.v1.PoolService"),
    "executor.addr": ("orchard.v1.ExecutorService",),
    "rewards.addr": ("orchard.v1.RewardService",),
}


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    with running_stack(tmp_path_factory.mktemp("edge-home")) as s:
        yield s


def address(stack: Stack, addr_file: str) -> str:
    return (stack.home / "run" / addr_file).read_text().strip()


def _channel(stack: Stack, addr_file: str) -> grpc.Channel:
    """Plaintext, except to the scheduler: it admits only internal certificates (mTLS)."""
    if addr_file == "scheduler.addr":
        gateway = InternalPKI.of_home(stack.home).identity("gateway", issue_missing=False)
        return gateway.channel("scheduler", address(stack, addr_file))
    return grpc.insecure_channel(address(stack, addr_file))


def test_every_service_answers_the_health_check_serving(stack: Stack) -> None:
    assert address(stack, "gateway.addr") == stack.endpoint
    for addr_file, services in SERVICES.items():
        with _channel(stack, addr_file) as channel:
            health = health_pb2_grpc.HealthStub(channel)
            for service in ("", *services):
                answer = health.Check(health_pb2.HealthCheckRequest(service=service), timeout=10)
                assert answer.status == health_pb2.HealthCheckResponse.SERVING, (addr_file, service)
            with pytest.raises(grpc.RpcError) as unknown:
                health.Check(health_pb2.HealthCheckRequest(service="no.such.Service"), timeout=10)
            assert unknown.value.code() == grpc.StatusCode.NOT_FOUND


def test_a_reward_service_refusal_says_whose_fault_it_was(stack: Stack) -> None:
    key = (stack.home / "dev-api-key").read_text().strip()
    rewards = Rewards(address(stack, "rewards.addr"), key)
    malformed = {**ROW, "FAIL_TO_PASS": "[not json"}
    with pytest.raises(InvalidRequestError, match="FAIL_TO_PASS") as bad:
        rewards.grade(malformed, "no patch")
    # The reason exists only in the orchard-reason trailer: proof the trailers arrived.
    assert (bad.value.code, bad.value.reason, bad.value.fault) == (
        "INVALID_ARGUMENT",
        "INVALID_FIELD",
        "client",
    )
    # A key the gateway refuses: its own reason and fault, passed on by the rewards service.
    with pytest.raises(AuthenticationError) as refused:
        Rewards(rewards.endpoint, "wrong-key").grade(ROW, "no patch")
    assert (refused.value.reason, refused.value.fault) == ("API_KEY_INVALID", "client")
    # The raw trailers, as any gRPC client sees them.
    with grpc.insecure_channel(rewards.endpoint) as channel:
        stub = rewards_pb2_grpc.RewardServiceStub(channel)
        with pytest.raises(grpc.RpcError) as raw:
            stub.Grade(
                rewards_pb2.GradeRequest(instance_json="{}", output=""),
                metadata=(("authorization", f"Bearer {key}"),),
                timeout=30,
            )
    trailers = dict(raw.value.trailing_metadata() or ())  # type: ignore[attr-defined]
    assert raw.value.code() == grpc.StatusCode.INVALID_ARGUMENT  # type: ignore[attr-defined]
    assert (trailers["orchard-reason"], trailers["orchard-fault"]) == ("INVALID_FIELD", "client")
