"""Asynchronous teardown (real runc): a delete answers once the record is DELETING.

The scheduler and the node executor run as child processes (``node_processes``)
on a temporary home; the scheduler drives the real ``local`` backend. Many
deletes are fired at once: the backend tears down at most ``cores * 4`` at a
time, so when every reply is back some teardowns must still be queued (with
the old synchronous delete, every record was DELETED before its reply). Then:
the teardowns finish and leave nothing; and a kill -9 of the scheduler while
they run, then a restart, finishes them (recovery) and leaves nothing either.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from orchard.scheduler.store import LIVE_STATES, SandboxStore, State

from orchard._proto.orchard.v1 import sandbox_pb2, sandbox_pb2_grpc
from tests.cgroup_paths import sandbox_cgroup_dirs
from tests.runtime.runtime_helpers import force_cleanup_home, mounts_under
from tests.stack import REQUIRES_STACK

from .node_processes import as_gateway, free_port, run_in, start_local_scheduler, start_service
from .waiting import wait_for

pytestmark = [*REQUIRES_STACK, pytest.mark.timeout(180)]

TENANT = (("orchard-tenant", "alice"),)
COUNT = 24


@pytest.fixture
def home() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="orch-td-", dir="/tmp"))
    try:
        yield path
    finally:
        force_cleanup_home(path)


def _create_many(stub: sandbox_pb2_grpc.SandboxServiceStub, n: int) -> list[sandbox_pb2.Sandbox]:
    request = sandbox_pb2.CreateSandboxRequest(resources={"memory_bytes": 128 << 20})  # type: ignore[arg-type]
    futures = [stub.CreateSandbox.future(request, metadata=TENANT, timeout=60) for _ in range(n)]
    return [f.result() for f in futures]


def _delete_all_at_once(stub: sandbox_pb2_grpc.SandboxServiceStub, ids: list[str]) -> None:
    futures = [
        stub.DeleteSandbox.future(
            sandbox_pb2.DeleteSandboxRequest(id=sid), metadata=TENANT, timeout=60
        )
        for sid in ids
    ]
    for f in futures:
        f.result()


def _states(home: Path, ids: list[str]) -> dict[str, State]:
    with contextlib.closing(SandboxStore(home / "state.db")) as store:
        found = {sid: store.get(sid) for sid in ids}
    return {sid: rec.state for sid, rec in found.items() if rec is not None}


def _assert_nothing_left(home: Path, ids: list[str]) -> None:
    runc_root = home / "run" / "runc"
    assert not runc_root.exists() or os.listdir(runc_root) == []
    assert os.listdir(home / "sandboxes") == []
    assert mounts_under(home) == []
    for sandbox_id in ids:
        assert sandbox_cgroup_dirs(sandbox_id) == []
    leftover = subprocess.run(
        ["pgrep", "-f", f"--home {home}"], capture_output=True, text=True, check=False
    )
    assert leftover.stdout.strip() == ""


def test_delete_answers_before_teardown_and_teardown_completes(home: Path) -> None:
    executor = start_service("executor", "orchard.executor", ["--listen", "127.0.0.1:0"], home)
    scheduler = start_local_scheduler(home, free_port(), executor)
    try:
        with as_gateway(home, scheduler.address) as channel:
            stub = sandbox_pb2_grpc.SandboxServiceStub(channel)
            boxes = _create_many(stub, COUNT)
            ids = [sb.id for sb in boxes]
            assert run_in(executor.address, boxes[0], ids[0], ["true"]).status.exit_code == 0
            _delete_all_at_once(stub, ids)
            at_reply = _states(home, ids)
            assert set(at_reply.values()) <= {State.DELETING, State.DELETED}, at_reply
            assert State.DELETING in at_reply.values(), "every teardown was done before its reply"
            # A status query shows the record as it stands: DELETING, then DELETED.
            answered = {
                stub.GetSandbox(
                    sandbox_pb2.GetSandboxRequest(id=sid), metadata=TENANT, timeout=10
                ).state
                for sid in ids
            }
            assert answered <= {sandbox_pb2.DELETING, sandbox_pb2.DELETED}
            wait_for(
                lambda: set(_states(home, ids).values()) == {State.DELETED},
                timeout=60,
                what="every teardown to finish",
            )
            final = stub.GetSandbox(
                sandbox_pb2.GetSandboxRequest(id=ids[-1]), metadata=TENANT, timeout=10
            )
            assert final.state == sandbox_pb2.DELETED
            _assert_nothing_left(home, ids)
    finally:
        assert scheduler.stop() == 0
        executor.stop()


def test_kill_9_mid_teardown_then_restart_finishes_it(home: Path) -> None:
    executor = start_service("executor", "orchard.executor", ["--listen", "127.0.0.1:0"], home)
    port = free_port()
    scheduler = start_local_scheduler(home, port, executor)
    try:
        with as_gateway(home, scheduler.address) as channel:
            stub = sandbox_pb2_grpc.SandboxServiceStub(channel)
            ids = [sb.id for sb in _create_many(stub, COUNT)]
            _delete_all_at_once(stub, ids)
            scheduler.kill9()
        crashed = _states(home, ids)
        assert State.DELETING in crashed.values(), "the kill came after every teardown"
        assert set(crashed.values()) <= {State.DELETING, State.DELETED}
        scheduler = start_local_scheduler(home, port, executor)  # recovery runs before it serves
        after = _states(home, ids)
        assert set(after.values()) == {State.DELETED}, after
        with contextlib.closing(SandboxStore(home / "state.db")) as store:
            assert store.find(states=LIVE_STATES) == []
        _assert_nothing_left(home, ids)
    finally:
        assert scheduler.stop() == 0
        executor.stop()
    _assert_nothing_left(home, ids)
