"""Idempotent create and leases over real gRPC and SQLite (stand-in backend, see conftest)."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import pytest
from orchard.scheduler.store import State

from orchard._proto.orchard.v1 import sandbox_pb2

from .conftest import EnvFakeBackend, start_pool_plane
from .waiting import wait_for


@pytest.mark.parametrize("template", ["", "small"])
def test_concurrent_retries_of_one_request_id_make_one_sandbox(
    tmp_path: Path, template: str
) -> None:
    backend = EnvFakeBackend(create_delay=0.05)
    plane = start_pool_plane(tmp_path, backend)
    request = sandbox_pb2.CreateSandboxRequest(request_id="job-7", template=template)
    try:
        with ThreadPoolExecutor(16) as workers:
            got = list(
                workers.map(
                    lambda _: plane.stub.CreateSandbox(request, metadata=plane.auth(), timeout=30),
                    range(40),
                )
            )
        assert len({sb.id for sb in got}) == 1
        records = plane.loop.call(lambda: plane.scheduler.store.find(tenant="alice"))
        assert [r.id for r in records] == [got[0].id]
        # Another tenant's request_id space is its own.
        other = plane.stub.CreateSandbox(request, metadata=plane.auth("bob"))
        assert other.id != got[0].id
        wait_for(
            lambda: plane.loop.call(plane.scheduler.store.pool_counts)["small"]["ready"] == 4,
            what="the pool refilled before the restart",
        )
    finally:
        plane.stop()
        plane.loop.close()
    # Across a restart (same home, same state.db): the retry still gets the same sandbox.
    creates = backend.creates
    plane = start_pool_plane(tmp_path, backend)
    try:
        again = plane.stub.CreateSandbox(request, metadata=plane.auth())
        assert again.id == got[0].id
        assert again.state in (sandbox_pb2.READY, sandbox_pb2.CLAIMED)
        # No second sandbox for job-7, and the pool's members were adopted, not remade.
        time.sleep(0.2)
        assert backend.creates == creates
    finally:
        plane.stop()
        plane.loop.close()


def _expiry(sb: sandbox_pb2.Sandbox) -> float:
    return sb.expires_at.seconds + sb.expires_at.nanos / 1e9


def test_keepalive_extends_the_lease_and_unrenewed_sandboxes_are_reaped(tmp_path: Path) -> None:
    backend = EnvFakeBackend()
    plane = start_pool_plane(tmp_path, backend)
    try:
        kept = plane.stub.CreateSandbox(
            sandbox_pb2.CreateSandboxRequest(ttl_seconds=2), metadata=plane.auth()
        )
        dropped = plane.stub.CreateSandbox(
            sandbox_pb2.CreateSandboxRequest(template="small", ttl_seconds=2),
            metadata=plane.auth(),
        )
        assert kept.ttl_seconds == 2
        deadline = time.monotonic() + 4
        while time.monotonic() < deadline:  # heartbeats every 0.5 s, past the 2 s ttl
            renewed = plane.stub.KeepAlive(
                sandbox_pb2.KeepAliveRequest(id=kept.id), metadata=plane.auth()
            )
            assert _expiry(renewed) >= time.time() + 1.4
            assert renewed.executor.token  # a usable answer, like GetSandbox
            time.sleep(0.5)
        got = plane.stub.GetSandbox(
            sandbox_pb2.GetSandboxRequest(id=kept.id), metadata=plane.auth()
        )
        assert got.state == sandbox_pb2.READY and kept.id in backend.sandboxes
        gone = plane.stub.GetSandbox(
            sandbox_pb2.GetSandboxRequest(id=dropped.id), metadata=plane.auth()
        )
        assert gone.state == sandbox_pb2.DELETED and gone.state_reason == "ttl expired"
        assert dropped.id not in backend.sandboxes
        # An explicit longer lease; the expiry never moves back.
        longer = plane.stub.KeepAlive(
            sandbox_pb2.KeepAliveRequest(id=kept.id, ttl_seconds=600), metadata=plane.auth()
        )
        shorter = plane.stub.KeepAlive(
            sandbox_pb2.KeepAliveRequest(id=kept.id, ttl_seconds=5), metadata=plane.auth()
        )
        assert _expiry(shorter) == _expiry(longer) >= time.time() + 590
    finally:
        plane.stop()
        plane.loop.close()


@pytest.mark.parametrize(
    ("request_fields", "tenant", "code"),
    [
        ({"id": "", "ttl_seconds": 5}, "alice", grpc.StatusCode.INVALID_ARGUMENT),
        ({"id": "sb-unknown00000"}, "alice", grpc.StatusCode.NOT_FOUND),
        ({"id": "KNOWN", "ttl_seconds": -3}, "alice", grpc.StatusCode.INVALID_ARGUMENT),
        ({"id": "KNOWN", "ttl_seconds": 10**9}, "alice", grpc.StatusCode.INVALID_ARGUMENT),
        ({"id": "KNOWN"}, "bob", grpc.StatusCode.NOT_FOUND),
        ({"id": "DELETED"}, "alice", grpc.StatusCode.FAILED_PRECONDITION),
    ],
)
def test_bad_keepalives_get_clear_statuses(
    tmp_path: Path, request_fields: dict[str, object], tenant: str, code: grpc.StatusCode
) -> None:
    plane = start_pool_plane(tmp_path, EnvFakeBackend())
    try:
        known = plane.stub.CreateSandbox(sandbox_pb2.CreateSandboxRequest(), metadata=plane.auth())
        deleted = plane.stub.CreateSandbox(
            sandbox_pb2.CreateSandboxRequest(), metadata=plane.auth()
        )
        plane.stub.DeleteSandbox(
            sandbox_pb2.DeleteSandboxRequest(id=deleted.id), metadata=plane.auth()
        )
        ids = {"KNOWN": known.id, "DELETED": deleted.id}
        fields = {**request_fields, "id": ids.get(str(request_fields["id"]), request_fields["id"])}
        with pytest.raises(grpc.RpcError) as info:
            plane.stub.KeepAlive(
                sandbox_pb2.KeepAliveRequest(**fields),  # type: ignore[arg-type]
                metadata=plane.auth(tenant),
            )
        assert info.value.code() == code, info.value.details()
    finally:
        plane.stop()
        plane.loop.close()


def test_failed_states_say_whose_fault(tmp_path: Path) -> None:
    backend = EnvFakeBackend()
    plane = start_pool_plane(tmp_path, backend, templates="")  # no pool to take the failure
    try:
        backend.fail_next_create = "the node ran out of disk"
        with pytest.raises(grpc.RpcError) as info:
            plane.stub.CreateSandbox(
                sandbox_pb2.CreateSandboxRequest(request_id="r1"), metadata=plane.auth()
            )
        assert info.value.code() == grpc.StatusCode.UNAVAILABLE
        assert dict(info.value.trailing_metadata())["orchard-fault"] == "infrastructure"  # type: ignore[arg-type]
        failed = plane.loop.call(lambda: plane.scheduler.store.get_by_request("alice", "r1"))
        assert failed is not None and failed.state == State.FAILED
        got = plane.stub.GetSandbox(
            sandbox_pb2.GetSandboxRequest(id=failed.id), metadata=plane.auth()
        )
        assert got.state == sandbox_pb2.FAILED and got.fault == "infrastructure"
        assert "out of disk" in got.state_reason
        with pytest.raises(grpc.RpcError) as info:
            plane.stub.CreateSandbox(
                sandbox_pb2.CreateSandboxRequest(image="nosuchimage"), metadata=plane.auth()
            )
        assert dict(info.value.trailing_metadata())["orchard-fault"] == "client"  # type: ignore[arg-type]
        listed = plane.stub.ListSandboxes(sandbox_pb2.ListSandboxesRequest(), metadata=plane.auth())
        faults = {s.state_reason.split(":")[0]: s.fault for s in listed.sandboxes if s.fault}
        assert sorted(faults.values()) == ["client", "infrastructure"]
    finally:
        plane.stop()
        plane.loop.close()
