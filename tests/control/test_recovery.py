"""Restart recovery: the store is reconciled with the backend before serving.

The state a crash leaves is written straight into a real state.db; the backend
is the stand-in ``FakeBackend`` holding the "containers" that survived.
"""

from __future__ import annotations

import time
from pathlib import Path

from orchard.scheduler.backends.base import SandboxSpec
from orchard.scheduler.store import SCHEMA_VERSION, SandboxRecord, SandboxStore, State

from .conftest import start_control_plane
from .fake_backend import FakeBackend


def _record(sandbox_id: str, state: State) -> SandboxRecord:
    now = time.time()
    return SandboxRecord(
        id=sandbox_id, tenant="dev", image="", cpu_millis=1000, memory_bytes=1 << 30, pids=512,
        network_mode=1, ttl_seconds=3600, created_at=now, expires_at=now + 3600, state=state,
    )  # fmt: skip


def test_recovery_reconciles_store_and_backend(tmp_path: Path) -> None:
    store = SandboxStore(tmp_path / "state.db")
    assert store.schema_version == SCHEMA_VERSION
    for sid, state in [
        ("sb-pendingalive", State.PENDING),
        ("sb-readyalive00", State.READY),
        ("sb-readygone000", State.READY),
        ("sb-deleting0000", State.DELETING),
        ("sb-failedalive0", State.FAILED),
    ]:
        store.insert(_record(sid, state))
    store.close()
    backend = FakeBackend()
    for sid in (
        "sb-pendingalive",
        "sb-readyalive00",
        "sb-deleting0000",
        "sb-failedalive0",
        "sb-orphan000000",
    ):
        backend.sandboxes[sid] = SandboxSpec(sandbox_id=sid)

    plane = start_control_plane(tmp_path, backend)
    try:
        states = {r.id: r.state for r in plane.scheduler.store.find(states=tuple(State))}
        assert states == {
            "sb-pendingalive": State.FAILED,
            "sb-readyalive00": State.READY,
            "sb-readygone000": State.FAILED,
            "sb-deleting0000": State.DELETED,
            "sb-failedalive0": State.FAILED,
        }
        assert set(backend.sandboxes) == {"sb-readyalive00"}
        gone = plane.scheduler.store.get("sb-readygone000")
        assert (
            gone is not None
            and gone.fault == "infrastructure"
            and "disappeared" in gone.state_reason
        )
    finally:
        plane.stop()
        plane.loop.close()


def test_state_survives_a_restart_and_shutdown_can_delete_all(tmp_path: Path) -> None:
    from orchard.scheduler.settings import SchedulerSettings

    from orchard._proto.orchard.v1 import sandbox_pb2

    backend = FakeBackend()
    plane = start_control_plane(tmp_path, backend)
    made = plane.stub.CreateSandbox(
        sandbox_pb2.CreateSandboxRequest(labels={"k": "v"}), metadata=plane.auth()
    )
    plane.stop()
    plane.loop.close()

    def settings(home: Path) -> SchedulerSettings:
        return SchedulerSettings(
            home=home, executor_address="127.0.0.1:1", delete_all_on_shutdown=True
        )

    plane = start_control_plane(tmp_path, backend, settings)
    got = plane.stub.GetSandbox(sandbox_pb2.GetSandboxRequest(id=made.id), metadata=plane.auth())
    assert got.state == sandbox_pb2.READY and dict(got.labels) == {"k": "v"}
    plane.stop()
    plane.loop.close()
    assert backend.sandboxes == {}
    store = SandboxStore(tmp_path / "state.db")
    rec = store.get(made.id)
    assert rec is not None and rec.state == State.DELETED
