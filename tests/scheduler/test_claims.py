"""Claims from warm pools over real gRPC and a real SQLite store (stand-in backend, see conftest).

The property that matters most: no sandbox is ever handed out twice, however
many claims race, and every claim gets exactly one sandbox (from the pool or
cold).
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import pytest
from orchard.scheduler.store import POOL_TENANT, SandboxRecord, SandboxStore, State
from orchard.scheduler.templates import Template

from orchard._proto.orchard.v1 import common_pb2, pools_pb2, sandbox_pb2

from .conftest import ControlPlane, EnvFakeBackend
from .waiting import wait_for


def _ready(plane: ControlPlane, template: str = "small") -> int:
    resp = plane.pools.ListPools(pools_pb2.ListPoolsRequest(), metadata=plane.auth())
    return next(p.ready for p in resp.pools if p.template.name == template)


def _claim(plane: ControlPlane, tenant: str = "alice", **fields: object) -> sandbox_pb2.Sandbox:
    request = sandbox_pb2.CreateSandboxRequest(template="small", **fields)  # type: ignore[arg-type]
    result: sandbox_pb2.Sandbox = plane.stub.CreateSandbox(
        request, metadata=plane.auth(tenant), timeout=30
    )
    return result


def test_pool_fills_to_min_and_members_are_invisible(pool_plane: ControlPlane) -> None:
    wait_for(lambda: _ready(pool_plane) == 4, what="4 ready members")
    listed = pool_plane.stub.ListSandboxes(
        sandbox_pb2.ListSandboxesRequest(), metadata=pool_plane.auth()
    )
    assert list(listed.sandboxes) == []
    member = pool_plane.scheduler.store.find(tenant=POOL_TENANT, template="small")[0]
    with pytest.raises(grpc.RpcError) as info:
        pool_plane.stub.GetSandbox(
            sandbox_pb2.GetSandboxRequest(id=member.id), metadata=pool_plane.auth()
        )
    assert info.value.code() == grpc.StatusCode.NOT_FOUND


def test_claim_adopts_a_member_and_applies_the_claim(
    pool_plane: ControlPlane, env_backend: EnvFakeBackend
) -> None:
    wait_for(lambda: _ready(pool_plane) == 4, what="a full pool")
    made_before = env_backend.creates
    before = time.time()
    sb = _claim(
        pool_plane, env={"TASK": "42", "OVERRIDE": "claim"}, labels={"run": "r1"}, ttl_seconds=90
    )
    assert sb.state == sandbox_pb2.CLAIMED and sb.template == "small" and sb.tenant == "alice"
    assert sb.executor.token and sb.executor.address
    assert sb.resources.cpu_millis == 500 and sb.resources.memory_bytes == 256 << 20
    assert dict(sb.labels) == {"run": "r1"}
    assert dict(sb.env) == {"BASE": "from-template", "OVERRIDE": "claim", "TASK": "42"}
    assert before + 89 <= sb.expires_at.seconds + sb.expires_at.nanos / 1e9 <= time.time() + 91
    # The claim's env reached the backend (the local backend writes it into sandbox.json).
    assert env_backend.env_updates[sb.id] == {"TASK": "42", "OVERRIDE": "claim"}
    assert env_backend.creates == made_before  # adopted, not created
    got = pool_plane.stub.GetSandbox(
        sandbox_pb2.GetSandboxRequest(id=sb.id), metadata=pool_plane.auth()
    )
    assert got.state == sandbox_pb2.CLAIMED
    # Another tenant cannot see it; the pool refills behind the claim.
    with pytest.raises(grpc.RpcError):
        pool_plane.stub.GetSandbox(
            sandbox_pb2.GetSandboxRequest(id=sb.id), metadata=pool_plane.auth("bob")
        )
    wait_for(lambda: _ready(pool_plane) >= 4, what="the pool to refill")
    status = pool_plane.pools.ListPools(pools_pb2.ListPoolsRequest(), metadata=pool_plane.auth())
    small = next(p for p in status.pools if p.template.name == "small")
    assert (small.hits, small.misses, small.claimed) == (1, 0, 1)


def test_empty_pool_falls_back_to_a_cold_create_and_counts_a_miss(
    pool_plane: ControlPlane,
) -> None:
    sb = pool_plane.stub.CreateSandbox(
        sandbox_pb2.CreateSandboxRequest(template="empty", env={"A": "1"}),
        metadata=pool_plane.auth(),
    )
    assert sb.state == sandbox_pb2.CLAIMED and sb.template == "empty" and dict(sb.env) == {"A": "1"}
    status = pool_plane.pools.ListPools(pools_pb2.ListPoolsRequest(), metadata=pool_plane.auth())
    empty = next(p for p in status.pools if p.template.name == "empty")
    assert (empty.hits, empty.misses) == (0, 1)


def test_many_concurrent_claims_never_share_a_sandbox(
    pool_plane: ControlPlane, env_backend: EnvFakeBackend
) -> None:
    wait_for(lambda: _ready(pool_plane) == 4, what="a full pool")
    pool_plane.pools.Hint(
        pools_pb2.DemandHint(template="small", count=40, within_seconds=0),
        metadata=pool_plane.auth(),
    )
    wait_for(lambda: _ready(pool_plane) >= 40, what="the hinted batch to be warm")
    tenants = [f"t{i % 5}" for i in range(200)]
    with ThreadPoolExecutor(32) as workers:
        got = list(workers.map(lambda t: (t, _claim(pool_plane, t)), tenants))
    ids = [sb.id for _, sb in got]
    assert len(set(ids)) == 200, Counter(ids).most_common(3)
    assert all(sb.state == sandbox_pb2.CLAIMED and sb.tenant == t for t, sb in got)

    def owners() -> dict[str, str]:
        return {r.id: r.tenant for r in pool_plane.scheduler.store.find(states=(State.CLAIMED,))}

    assert pool_plane.loop.call(owners) == {sb.id: t for t, sb in got}
    status = pool_plane.pools.ListPools(pools_pb2.ListPoolsRequest(), metadata=pool_plane.auth())
    small = next(p for p in status.pools if p.template.name == "small")
    assert small.hits + small.misses == 200 and small.hits >= 40


def _member(sandbox_id: str, now: float) -> SandboxRecord:
    return SandboxRecord(
        id=sandbox_id, tenant=POOL_TENANT, template="t", image="", cpu_millis=1000,
        memory_bytes=1 << 30, pids=512, network_mode=1, ttl_seconds=600, created_at=now,
        expires_at=now + 600, state=State.READY,
    )  # fmt: skip


CLAIMER = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from orchard.scheduler.store import SandboxStore
    store = SandboxStore(Path(sys.argv[1]))
    won = []
    while True:
        rec = store.claim("t", sys.argv[2], request_id="", labels={}, env={"W": sys.argv[2]},
                          ttl_seconds=60, now=time.time())
        if rec is None:
            break
        won.append(rec.id)
    print(" ".join(won))
    """
)


def test_claims_from_separate_processes_on_one_database_never_collide(tmp_path: Path) -> None:
    """The compare-and-set holds across connections and processes, not only on one loop."""
    db = tmp_path / "state.db"
    store = SandboxStore(db)
    now = time.time()
    for i in range(300):
        store.insert(_member(f"sb-member{i:05d}", now + i * 1e-6))
    workers = [
        subprocess.Popen(
            [sys.executable, "-c", CLAIMER, str(db), f"w{n}"], stdout=subprocess.PIPE, text=True
        )
        for n in range(6)
    ]
    won = {f"w{n}": w.communicate(timeout=60)[0].split() for n, w in enumerate(workers)}
    assert all(w.returncode == 0 for w in workers)
    every = [sid for ids in won.values() for sid in ids]
    assert len(every) == 300 and len(set(every)) == 300
    for worker, ids in won.items():
        for sid in ids:
            rec = store.get(sid)
            assert rec is not None and rec.tenant == worker and rec.env == {"W": worker}
            assert rec.state == State.CLAIMED


def test_a_broken_member_is_discarded_and_the_next_one_claimed(
    pool_plane: ControlPlane, env_backend: EnvFakeBackend
) -> None:
    wait_for(lambda: _ready(pool_plane) == 4, what="a full pool")
    oldest = pool_plane.loop.call(
        lambda: pool_plane.scheduler.store.find(tenant=POOL_TENANT, template="small")[0]
    )
    env_backend.broken.add(oldest.id)
    sb = _claim(pool_plane, env={"X": "1"}, request_id="req-broken")
    assert sb.id != oldest.id and sb.state == sandbox_pb2.CLAIMED
    wait_for(lambda: oldest.id not in env_backend.sandboxes, what="the broken member removed")
    gone = pool_plane.loop.call(lambda: pool_plane.scheduler.store.get(oldest.id))
    assert gone is not None and gone.state == State.DELETED and gone.request_id == ""
    again = _claim(pool_plane, env={"X": "1"}, request_id="req-broken")
    assert again.id == sb.id


@pytest.mark.parametrize(
    ("fields", "code", "message"),
    [
        ({"template": "nope"}, grpc.StatusCode.NOT_FOUND, "template 'nope' not found"),
        ({"template": "small", "image": "x"}, grpc.StatusCode.INVALID_ARGUMENT, "image"),
        (
            {"template": "small", "resources": common_pb2.Resources(cpu_millis=100)},
            grpc.StatusCode.INVALID_ARGUMENT,
            "resources: set by the template",
        ),
        ({"template": "small", "env": {"1A": "x"}}, grpc.StatusCode.INVALID_ARGUMENT, "env"),
    ],
)
def test_bad_template_requests_get_clear_statuses(
    pool_plane: ControlPlane, fields: dict[str, object], code: grpc.StatusCode, message: str
) -> None:
    with pytest.raises(grpc.RpcError) as info:
        pool_plane.stub.CreateSandbox(
            sandbox_pb2.CreateSandboxRequest(**fields),  # type: ignore[arg-type]
            metadata=pool_plane.auth(),
        )
    assert info.value.code() == code and message in (info.value.details() or "")


@pytest.mark.parametrize(
    ("hint", "message"),
    [
        (pools_pb2.DemandHint(template="small", count=0), "count must be between 1"),
        (pools_pb2.DemandHint(template="small", count=61), "count must be between 1"),
        (pools_pb2.DemandHint(template="small", count=1, within_seconds=-1), "within_seconds"),
        (pools_pb2.DemandHint(template="small", count=1, within_seconds=1e9), "within_seconds"),
        (pools_pb2.DemandHint(count=1), "template: a template name is required"),
    ],
)
def test_bad_hints_are_refused(
    pool_plane: ControlPlane, hint: pools_pb2.DemandHint, message: str
) -> None:
    with pytest.raises(grpc.RpcError) as info:
        pool_plane.pools.Hint(hint, metadata=pool_plane.auth())
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert message in (info.value.details() or "")


def test_surplus_members_are_retired_after_the_scale_down_delay(tmp_path: Path) -> None:
    from .conftest import pool_settings, start_pool_plane

    backend = EnvFakeBackend()
    plane = start_pool_plane(
        tmp_path, backend, make_settings=lambda h: pool_settings(h, scale_down_delay_seconds=0.3)
    )
    try:
        plane.pools.Hint(
            pools_pb2.DemandHint(template="empty", count=6, within_seconds=0),
            metadata=plane.auth(),
        )
        wait_for(lambda: _ready(plane, "empty") == 6, what="the hinted members")
        # Nobody claims; the hint is held for hint_hold_seconds (60 s), so drop it by hand.
        plane.loop.call(lambda: plane.scheduler.pools.pools["empty"].hints.clear())
        wait_for(lambda: _ready(plane, "empty") == 0, what="the surplus retired")
        # Only the "small" pool's 4 members remain in the backend.
        wait_for(lambda: len(backend.sandboxes) == 4, what="the containers removed")
        assert plane.scheduler.pools.pools["empty"].retired == 6
    finally:
        plane.stop()
        plane.loop.close()


def test_a_failing_template_backs_off_and_leaves_no_rows(tmp_path: Path) -> None:
    from .conftest import start_pool_plane

    backend = EnvFakeBackend()
    plane = start_pool_plane(tmp_path, backend, '[templates.gone]\nimage = "missing"\nmin = 2\n')
    try:
        wait_for(lambda: backend.creates >= 2, what="member creates")
        time.sleep(0.5)
        pool = plane.scheduler.pools.pools["gone"]
        # 0.05 s ticks for 0.5 s, but doubling backoff: a handful of tries, not ten per tick.
        assert 2 <= backend.creates <= 8 and pool.create_failures == backend.creates
        assert "not found" in pool.last_error
        wait_for(
            lambda: not plane.loop.call(lambda: plane.scheduler.store.find(template="gone")),
            what="failed members' rows to end DELETED",
        )
    finally:
        plane.stop()
        plane.loop.close()


def test_template_object_round_trips_to_proto() -> None:
    proto = Template("x", image="debian", cpu_millis=250, min=1, max=3).to_proto()
    assert (proto.name, proto.image, proto.resources.cpu_millis) == ("x", "debian", 250)
