"""kill -9 of the scheduler while sandboxes are created, claimed, used and deleted (real runc).

Real processes: the node executor and the scheduler run as children of the
test (``node_processes``); the scheduler drives the real ``local`` backend
with a warm pool. Clients call the scheduler directly with the tenant
metadata the gateway would add, and exec through the real executor.

After the kill and a restart on the same home and port, every sandbox must
be accounted for: each container on the node is a live record (adopted) and
each live record has a running container (else it was reaped/failed); the
adopted ones still run commands; the pool is back at its min. A graceful stop
(--delete-all-on-shutdown) then leaves no container, folder, mount, cgroup,
process or live SQLite row.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from orchard.scheduler.store import LIVE_STATES, USABLE_STATES, SandboxStore, State

from orchard._proto.orchard.v1 import pools_pb2, pools_pb2_grpc, sandbox_pb2, sandbox_pb2_grpc
from tests.cgroup_paths import sandbox_cgroup_dirs
from tests.runtime.runtime_helpers import force_cleanup_home, mounts_under
from tests.stack import REQUIRES_STACK

from .node_processes import as_gateway, free_port, run_in, start_local_scheduler, start_service
from .waiting import wait_for

pytestmark = [*REQUIRES_STACK, pytest.mark.timeout(240)]

TENANT = (("orchard-tenant", "alice"),)
TEMPLATES = "[templates.warm]\nmemory_bytes = 268435456\npids = 256\nmin = 4\nmax = 8\n"


@pytest.fixture
def home() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="orch-rs-", dir="/tmp"))
    (path / "templates.toml").write_text(TEMPLATES)
    try:
        yield path
    finally:
        force_cleanup_home(path)


def _runc_ids(home: Path) -> set[str]:
    out = subprocess.run(
        ["runc", "--root", str(home / "run" / "runc"), "list", "-q"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    return set(out.stdout.split())


def _pool(channel: grpc.Channel) -> pools_pb2.PoolStatus:
    stub = pools_pb2_grpc.PoolServiceStub(channel)
    return stub.ListPools(pools_pb2.ListPoolsRequest(), metadata=TENANT, timeout=5).pools[0]


class Load:
    """Client threads: create (plain, with a request id) or claim, exec, delete every other one."""

    def __init__(self, home: Path, address: str, executor: str) -> None:
        self.home, self.address, self.executor = home, address, executor
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.answered: dict[str, str] = {}  # request_id -> sandbox id the client was told
        self.sent: list[str] = []
        self.errors: list[grpc.StatusCode] = []
        self.execs = 0

    def worker(self, n: int) -> None:
        with as_gateway(self.home, self.address) as channel:
            stub = sandbox_pb2_grpc.SandboxServiceStub(channel)
            i = 0
            while not self.stop.is_set():
                i += 1
                request_id = f"w{n}-{i}"
                request = sandbox_pb2.CreateSandboxRequest(
                    request_id=request_id,
                    template="warm" if i % 3 == 1 else "",
                    resources=None if i % 3 == 1 else {"memory_bytes": 256 << 20},  # type: ignore[arg-type]
                    env={"N": str(i)},
                )
                with self.lock:
                    self.sent.append(request_id)
                try:
                    sb = stub.CreateSandbox(request, metadata=TENANT, timeout=20)
                    with self.lock:
                        self.answered[request_id] = sb.id
                    out = run_in(self.executor, sb, sb.id, ["sh", "-c", "echo $N"])
                    assert out.stdout == f"{i}\n".encode(), out
                    with self.lock:
                        self.execs += 1
                    if i % 3 == 0:
                        stub.DeleteSandbox(
                            sandbox_pb2.DeleteSandboxRequest(id=sb.id), metadata=TENANT, timeout=20
                        )
                except grpc.RpcError as exc:
                    with self.lock:
                        self.errors.append(exc.code())
                    time.sleep(0.05)


def test_kill_9_of_the_scheduler_mid_load_loses_and_leaks_nothing(home: Path) -> None:
    executor = start_service("executor", "orchard.executor", ["--listen", "127.0.0.1:0"], home)
    port = free_port()
    scheduler = start_local_scheduler(home, port, executor)
    seen: set[str] = set()
    try:
        channel = as_gateway(home, scheduler.address)
        wait_for(lambda: _pool(channel).ready == 4, timeout=60, what="the warm pool")
        load = Load(home, scheduler.address, executor.address)
        threads = [threading.Thread(target=load.worker, args=(n,)) for n in range(4)]
        for t in threads:
            t.start()
        wait_for(lambda: load.execs >= 6, timeout=60, what="some sandboxes in use")
        scheduler.kill9()  # mid-create, mid-exec, mid-delete
        time.sleep(0.5)
        load.stop.set()
        for t in threads:
            t.join(60)
        channel.close()
        assert load.execs >= 6 and load.answered

        # What the crash left in the store: members that were warm must be adopted.
        with contextlib.closing(SandboxStore(home / "state.db")) as crashed:
            warm = {r.id for r in crashed.find(states=USABLE_STATES) if r.in_pool}
        restarted_at = time.time()
        scheduler = start_local_scheduler(home, port, executor)
        # The new scheduler's pool filler is already making members: read the
        # node first, then the store (a record is written before its folder).
        containers = _runc_ids(home)
        folders = set(os.listdir(home / "sandboxes"))
        store = SandboxStore(home / "state.db")
        live = {r.id: r for r in store.find(states=LIVE_STATES)}
        seen = {r.id for r in store.find(states=tuple(State))}
        # Nothing on the node is unknown: every container and folder is a live record.
        assert containers <= set(live) and folders <= set(live), (containers, folders, live)
        # Everything from before the crash that is still live is usable and running
        # (adopted); the rest was failed or finished by recovery.
        before = {sid: r for sid, r in live.items() if r.created_at < restarted_at}
        failed = {sid for sid, r in before.items() if r.state == State.FAILED}
        assert all(before[sid].fault == "infrastructure" for sid in failed)
        unusable = {
            sid: (r.state, r.state_reason)
            for sid, r in before.items()
            if sid not in failed and r.state not in USABLE_STATES
        }
        assert not unusable, unusable
        assert set(before) - failed <= containers and not failed & containers
        assert warm, "the crash left no warm member to adopt (the load claimed them all)"
        assert {sid for sid, r in before.items() if r.in_pool} == warm
        usable = {sid for sid, r in before.items() if not r.in_pool and sid not in failed}

        channel = as_gateway(home, scheduler.address)
        stub = sandbox_pb2_grpc.SandboxServiceStub(channel)
        # Each answer a client got is still true: a retry returns the same sandbox.
        for request_id, sandbox_id in load.answered.items():
            rec = store.get(sandbox_id)
            assert rec is not None and rec.request_id == request_id
        for sandbox_id in sorted(usable):
            access = stub.GetExecutorAccess(
                sandbox_pb2.GetSandboxRequest(id=sandbox_id), metadata=TENANT, timeout=10
            )
            assert run_in(executor.address, access, sandbox_id, ["true"]).status.exit_code == 0
        # The pool is whole again, and its adopted members are claimable and work.
        wait_for(lambda: _pool(channel).ready >= 4, timeout=60, what="the pool after restart")
        claimed = stub.CreateSandbox(
            sandbox_pb2.CreateSandboxRequest(template="warm", env={"AFTER": "restart"}),
            metadata=TENANT,
            timeout=30,
        )
        assert claimed.state == sandbox_pb2.CLAIMED
        out = run_in(executor.address, claimed, claimed.id, ["sh", "-c", "echo $AFTER"])
        assert out.stdout == b"restart\n"
        channel.close()
        store.close()
    finally:
        assert scheduler.stop() == 0
        executor.stop()

    # Nothing left behind.
    assert _runc_ids(home) == set()
    assert os.listdir(home / "sandboxes") == []
    assert mounts_under(home) == []
    for sandbox_id in seen:
        assert sandbox_cgroup_dirs(sandbox_id) == []
    leftover = subprocess.run(["pgrep", "-f", f"--home {home}"], capture_output=True, text=True)
    assert leftover.stdout.strip() == ""
    store = SandboxStore(home / "state.db")
    with contextlib.closing(store):
        assert store.find(states=LIVE_STATES) == []
