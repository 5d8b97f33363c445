"""A running load on a real stack, and what a fault test checks after it.

The fault tests (``test_faults*.py``) and the soak smoke test hit a real
``orchard up`` (``tests/stack.py``) with many sandboxes and keep calls in
flight while something breaks. This module holds the parts they share:

- :class:`StackLoad`: creates sandboxes in parallel, then keeps calls going
  from several client threads (short execs, long ``sleep`` execs, file
  writes, control-plane reads), every one with a deadline, and records each
  call's outcome (status code, start, end, deadline) and each acknowledged
  write (the bytes a client was told are stored).
- :class:`CallOutcome` and :func:`in_flight_summary`: which calls were in
  flight at a fault, how they ended, the worst overrun of a deadline.
- :func:`account`: the store's rows against the containers runc has, and
  :func:`leaks`: what is left on the host (processes, mounts, cgroups,
  netns, folders) of a set of sandboxes.
- :class:`StackProcesses`: the services ``orchard up`` runs, by name, to
  kill one and wait for its restart.
- :func:`heavy_lock`: the machine-wide lock every run that starts hundreds
  of sandboxes holds, so two engineers' heavy runs do not collide.

Calls go through the generated gRPC stubs, not the SDK: the SDK hides the
status code behind exception classes and some of its calls carry no
deadline, and here both are what is measured.
"""

from __future__ import annotations

import collections
import contextlib
import fcntl
import json
import os
import random
import signal
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

from orchard._proto.orchard.v1 import (
    common_pb2,
    executor_pb2,
    executor_pb2_grpc,
    sandbox_pb2,
    sandbox_pb2_grpc,
)
from tests.cgroup_paths import sandbox_cgroup_dirs

HEAVY_LOCK = Path("/tmp/orchard-heavy.lock")
CGROUP_ROOT = Path("/sys/fs/cgroup")
STATE_NAMES = {1: "PENDING", 2: "READY", 3: "DELETING", 4: "DELETED", 5: "FAILED", 6: "CLAIMED"}
LIVE = {"PENDING", "READY", "CLAIMED", "DELETING", "FAILED"}


@contextlib.contextmanager
def heavy_lock() -> Iterator[float]:
    """Hold the machine-wide heavy-run lock; yields the seconds spent waiting for it."""
    started = time.monotonic()
    with open(HEAVY_LOCK, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield time.monotonic() - started
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


# ---- one call's outcome ------------------------------------------------------


@dataclass(frozen=True)
class CallOutcome:
    op: str
    sandbox_id: str
    code: str
    """grpc.StatusCode name ("OK" for success)."""
    started: float
    ended: float
    deadline: float
    """Seconds the call was allowed (its gRPC deadline)."""
    detail: str = ""

    @property
    def duration(self) -> float:
        return self.ended - self.started

    @property
    def overrun(self) -> float:
        """Seconds past its deadline (0 when it ended in time)."""
        return max(0.0, self.duration - self.deadline)

    def in_flight_at(self, moment: float) -> bool:
        return self.started <= moment < self.ended


@dataclass(frozen=True)
class AckedWrite:
    sandbox_id: str
    path: str
    data: bytes


@dataclass
class LoadSandbox:
    id: str
    address: str
    token: str

    @property
    def metadata(self) -> tuple[tuple[str, str], ...]:
        return (("authorization", f"Bearer {self.token}"),)


def in_flight_summary(
    outcomes: Sequence[CallOutcome], moment: float, clear_codes: set[str]
) -> dict[str, Any]:
    """The calls in flight at ``moment``: how many, their codes, the unclear ones, worst overrun."""
    flying = [o for o in outcomes if o.in_flight_at(moment)]
    codes = collections.Counter(o.code for o in flying)
    unclear = [o for o in flying if o.code not in clear_codes]
    return {
        "in_flight": len(flying),
        "codes": dict(codes),
        "unclear": [f"{o.op} {o.sandbox_id} {o.code}: {o.detail[:160]}" for o in unclear][:10],
        "unclear_count": len(unclear),
        "max_overrun_s": round(max((o.overrun for o in flying), default=0.0), 3),
        "max_duration_s": round(max((o.duration for o in flying), default=0.0), 3),
        "by_op": dict(collections.Counter(o.op for o in flying)),
    }


def overall_summary(outcomes: Sequence[CallOutcome]) -> dict[str, Any]:
    return {
        "calls": len(outcomes),
        "codes": dict(collections.Counter(o.code for o in outcomes)),
        "max_overrun_s": round(max((o.overrun for o in outcomes), default=0.0), 3),
        "deadline_exceeded": sum(o.code == "DEADLINE_EXCEEDED" for o in outcomes),
    }


# ---- the load ---------------------------------------------------------------


class _Channels:
    """One channel per address, shared by the client threads (gRPC channels are thread-safe)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._channels: dict[str, grpc.Channel] = {}

    def get(self, address: str) -> grpc.Channel:
        with self._lock:
            channel = self._channels.get(address)
            if channel is None:
                channel = grpc.insecure_channel(
                    address,
                    options=[
                        # A restarted service is reached again within a second,
                        # not after gRPC's default backoff of up to two minutes.
                        # (not min_reconnect_backoff_ms: gRPC takes it as the connect
                        # deadline, tests/sdk/test_channel_options.py)
                        ("grpc.initial_reconnect_backoff_ms", 100),
                        ("grpc.max_reconnect_backoff_ms", 1000),
                    ],
                )
                self._channels[address] = channel
            return channel

    def close(self) -> None:
        with self._lock:
            for channel in self._channels.values():
                channel.close()
            self._channels.clear()


@dataclass
class LoadMix:
    """What the client threads do, and the deadline each call gets."""

    short_weight: int = 50
    write_weight: int = 30
    get_weight: int = 20
    sleepers: int = 8
    """Threads that only run ``sleep`` execs, so long calls are always in flight."""
    short_deadline: float = 10.0
    sleep_seconds: float = 3.0
    sleep_deadline: float = 10.0
    write_deadline: float = 10.0
    get_deadline: float = 10.0
    write_bytes: tuple[int, int] = (256, 4096)


@dataclass
class StackLoad:
    endpoint: str
    api_key: str
    threads: int = 12
    mix: LoadMix = field(default_factory=LoadMix)
    seed: int = 7
    outcomes: list[CallOutcome] = field(default_factory=list)
    acked_writes: list[AckedWrite] = field(default_factory=list)
    acked_creates: list[str] = field(default_factory=list)
    sandboxes: list[LoadSandbox] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._lock = threading.Lock()
        self._channels = _Channels()
        self._stop = threading.Event()
        self._workers: list[threading.Thread] = []
        self._write_seq = 0
        self.excluded: set[str] = set()
        """Sandboxes the workers leave alone (a fault test broke them on purpose)."""

    # -- plumbing

    @property
    def api_metadata(self) -> tuple[tuple[str, str], ...]:
        return (("authorization", f"Bearer {self.api_key}"),)

    def control(self) -> sandbox_pb2_grpc.SandboxServiceStub:
        return sandbox_pb2_grpc.SandboxServiceStub(self._channels.get(self.endpoint))  # type: ignore[no-untyped-call]

    def executor(self, box: LoadSandbox) -> executor_pb2_grpc.ExecutorServiceStub:
        return executor_pb2_grpc.ExecutorServiceStub(self._channels.get(box.address))  # type: ignore[no-untyped-call]

    def record(self, outcome: CallOutcome) -> None:
        with self._lock:
            self.outcomes.append(outcome)

    def call(self, op: str, sandbox_id: str, deadline: float, fn: Callable[[], Any]) -> Any:
        """Run one RPC, recording its outcome; returns its answer or None when it failed."""
        started = time.monotonic()
        try:
            answer = fn()
        except grpc.RpcError as err:
            code = err.code()  # type: ignore[attr-defined]
            self.record(
                CallOutcome(
                    op,
                    sandbox_id,
                    code.name if code is not None else "UNKNOWN",
                    started,
                    time.monotonic(),
                    deadline,
                    str(err.details()),  # type: ignore[attr-defined]
                )
            )
            return None
        self.record(CallOutcome(op, sandbox_id, "OK", started, time.monotonic(), deadline))
        return answer

    # -- calls

    def create(
        self, deadline: float = 60.0, memory_mib: int = 256, request_id: str = ""
    ) -> LoadSandbox | None:
        """One create; ``request_id`` makes a retry return the sandbox the first try made."""
        request = sandbox_pb2.CreateSandboxRequest(
            resources=common_pb2.Resources(cpu_millis=250, memory_bytes=memory_mib << 20),
            ttl_seconds=3600,
            request_id=request_id,
        )
        answer = self.call(
            "create",
            "",
            deadline,
            lambda: self.control().CreateSandbox(
                request, metadata=self.api_metadata, timeout=deadline
            ),
        )
        if answer is None:
            return None
        with self._lock:
            self.acked_creates.append(answer.id)
        return LoadSandbox(answer.id, answer.executor.address, answer.executor.token)

    def create_many(self, count: int, parallel: int = 16) -> list[LoadSandbox]:
        with ThreadPoolExecutor(parallel) as pool:
            made = [b for b in pool.map(lambda _: self.create(), range(count)) if b is not None]
        self.sandboxes.extend(made)
        return made

    def run(self, box: LoadSandbox, shell: str, timeout: float, deadline: float, op: str) -> Any:
        request = executor_pb2.RunRequest(
            start=executor_pb2.ExecStart(sandbox_id=box.id, shell=shell, timeout_seconds=timeout)
        )
        return self.call(
            op,
            box.id,
            deadline,
            lambda: self.executor(box).Run(request, metadata=box.metadata, timeout=deadline),
        )

    def write(self, box: LoadSandbox, path: str, data: bytes, deadline: float) -> bool:
        requests = [
            executor_pb2.WriteFileRequest(
                header=executor_pb2.WriteFileHeader(sandbox_id=box.id, path=path, make_parents=True)
            ),
            executor_pb2.WriteFileRequest(data=data),
            executor_pb2.WriteFileRequest(end=executor_pb2.WriteFileEnd(size=len(data))),
        ]
        answer = self.call(
            "write",
            box.id,
            deadline,
            lambda: self.executor(box).WriteFile(
                iter(requests), metadata=box.metadata, timeout=deadline
            ),
        )
        if answer is None or answer.size != len(data):
            return False
        with self._lock:
            self.acked_writes.append(AckedWrite(box.id, path, data))
        return True

    def read(self, box: LoadSandbox, path: str, deadline: float = 10.0) -> bytes | None:
        request = executor_pb2.ReadFileRequest(sandbox_id=box.id, path=path)

        def read_all() -> bytes:
            stream = self.executor(box).ReadFile(request, metadata=box.metadata, timeout=deadline)
            return b"".join(chunk.data for chunk in stream)

        answer = self.call("read", box.id, deadline, read_all)
        return answer if isinstance(answer, bytes) else None

    def get(self, sandbox_id: str, deadline: float) -> Any:
        request = sandbox_pb2.GetSandboxRequest(id=sandbox_id)
        return self.call(
            "get",
            sandbox_id,
            deadline,
            lambda: self.control().GetSandbox(
                request, metadata=self.api_metadata, timeout=deadline
            ),
        )

    def delete(self, sandbox_id: str, deadline: float = 60.0) -> bool:
        request = sandbox_pb2.DeleteSandboxRequest(id=sandbox_id)
        answer = self.call(
            "delete",
            sandbox_id,
            deadline,
            lambda: self.control().DeleteSandbox(
                request, metadata=self.api_metadata, timeout=deadline
            ),
        )
        return answer is not None

    def delete_all(self, parallel: int = 16) -> int:
        ids = [b.id for b in self.sandboxes]
        with ThreadPoolExecutor(parallel) as pool:
            done = sum(pool.map(self.delete, ids))
        return done

    # -- the running load

    def start(self) -> None:
        """Client threads keep calls in flight until :meth:`stop`."""
        assert self.sandboxes, "create sandboxes first"
        self._stop.clear()
        for index in range(self.threads + self.mix.sleepers):
            worker = threading.Thread(
                target=self._work,
                args=(random.Random(self.seed + index), index >= self.threads),
                daemon=True,
            )
            worker.start()
            self._workers.append(worker)

    def stop(self) -> None:
        self._stop.set()
        for worker in self._workers:
            worker.join(max(self.mix.sleep_deadline, self.mix.write_deadline) + 5)
        self._workers.clear()

    def close(self) -> None:
        self._channels.close()

    def _work(self, rng: random.Random, sleeper: bool) -> None:
        mix = self.mix
        ops = ["short", "write", "get"]
        weights = [mix.short_weight, mix.write_weight, mix.get_weight]
        while not self._stop.is_set():
            usable = [b for b in self.sandboxes if b.id not in self.excluded]
            if not usable:
                return
            box = rng.choice(usable)
            op = "sleep" if sleeper else rng.choices(ops, weights)[0]
            if op == "short":
                self.run(box, "echo ok", mix.short_deadline - 1, mix.short_deadline, "exec")
            elif op == "sleep":
                self.run(
                    box, f"sleep {mix.sleep_seconds}", mix.sleep_deadline - 1, mix.sleep_deadline,
                    "exec_sleep",
                )  # fmt: skip
            elif op == "write":
                with self._lock:
                    self._write_seq += 1
                    seq = self._write_seq
                data = rng.randbytes(rng.randint(*mix.write_bytes))
                self.write(box, f"/var/tmp/load/{seq}.bin", data, mix.write_deadline)
            else:
                self.get(box.id, mix.get_deadline)

    def outcomes_since(self, moment: float) -> list[CallOutcome]:
        with self._lock:
            return [o for o in self.outcomes if o.started >= moment]

    def first_ok_after(self, moment: float, ops: set[str]) -> float | None:
        """Seconds from ``moment`` until a call of ``ops`` that started after it succeeded."""
        with self._lock:
            ends = [
                o.ended
                for o in self.outcomes
                if o.started >= moment and o.op in ops and o.code == "OK"
            ]
        return (min(ends) - moment) if ends else None

    def verify_writes(self, sandbox_ids: set[str]) -> dict[str, Any]:
        """Read back every acknowledged write to ``sandbox_ids``: the same bytes must be there."""
        boxes = {b.id: b for b in self.sandboxes}
        checked = lost = 0
        examples: list[str] = []
        with self._lock:
            writes = [w for w in self.acked_writes if w.sandbox_id in sandbox_ids]
        for write in writes:
            checked += 1
            got = self.read(boxes[write.sandbox_id], write.path)
            if got != write.data:
                lost += 1
                if len(examples) < 5:
                    examples.append(f"{write.sandbox_id}:{write.path}")
        return {"acked_writes_checked": checked, "lost": lost, "lost_examples": examples}


def wait_until(check: Callable[[], bool], timeout: float, interval: float = 0.05) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(interval)
    return check()


# ---- the stack's processes ----------------------------------------------------


def _children(pid: int) -> list[int]:
    found: list[int] = []
    with contextlib.suppress(FileNotFoundError):
        for task in Path(f"/proc/{pid}/task").iterdir():
            with contextlib.suppress(FileNotFoundError):
                found.extend(int(c) for c in (task / "children").read_text().split())
    return found


def _module_of(pid: int) -> str:
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except FileNotFoundError:
        return ""
    if b"-m" in argv:
        index = argv.index(b"-m")
        if index + 1 < len(argv):
            return argv[index + 1].decode()
    return ""


@dataclass
class StackProcesses:
    """The services one ``orchard up`` (pid ``up_pid``) runs, found by module name."""

    up_pid: int

    def pids(self) -> dict[str, int]:
        return {_module_of(p): p for p in _children(self.up_pid) if _module_of(p)}

    def pid(self, service: str) -> int:
        return self.pids()[f"orchard.{service}"]

    def kill(self, service: str) -> int:
        """SIGKILL the service; returns its pid."""
        pid = self.pid(service)
        os.kill(pid, signal.SIGKILL)
        return pid

    def wait_restarted(self, service: str, old_pid: int, timeout: float = 30.0) -> int:
        """The new pid once ``orchard up`` has started the service again."""
        found: list[int] = []

        def restarted() -> bool:
            pid = self.pids().get(f"orchard.{service}")
            if pid is not None and pid != old_pid:
                found.append(pid)
                return True
            return False

        assert wait_until(restarted, timeout), f"{service} was not restarted in {timeout} s"
        return found[-1]

    def open_fds(self) -> dict[str, int]:
        counts = {}
        for module, pid in self.pids().items():
            with contextlib.suppress(FileNotFoundError):
                counts[module] = len(os.listdir(f"/proc/{pid}/fd"))
        return counts

    def rss_kib(self) -> dict[str, int]:
        sizes = {}
        for module, pid in self.pids().items():
            with contextlib.suppress(FileNotFoundError):
                for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                    if line.startswith("VmRSS:"):
                        sizes[module] = int(line.split()[1])
        return sizes


# ---- accounting and leaks -------------------------------------------------------


def store_rows(home: Path) -> dict[str, tuple[str, str, str]]:
    """id -> (state, fault, reason) from the scheduler's SQLite store, opened read-only."""
    uri = f"file:{home / 'state.db'}?mode=ro"
    with contextlib.closing(sqlite3.connect(uri, uri=True, timeout=10)) as db:
        rows = db.execute("SELECT id, state, fault, error_reason FROM sandboxes").fetchall()
    return {r[0]: (STATE_NAMES.get(r[1], str(r[1])), r[2], r[3]) for r in rows}


def runc_containers(home: Path) -> dict[str, bool]:
    """id -> running, from runc's state dir of this home (read without running runc)."""
    root = home / "run" / "runc"
    found: dict[str, bool] = {}
    with contextlib.suppress(FileNotFoundError):
        for entry in root.iterdir():
            state = entry / "state.json"
            try:
                data = json.loads(state.read_text())
            except (OSError, ValueError):
                found[entry.name] = False
                continue
            pid = int(data.get("init_process_pid") or 0)
            found[entry.name] = pid > 0 and _is_running(pid)
    return found


def _is_running(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rfind(")") + 2 :].split()[0] != "Z"


def account(home: Path, acked_creates: Sequence[str]) -> dict[str, Any]:
    """Every sandbox accounted for: store rows against runc's containers.

    - ``missing_rows``: a create that returned an id has no row;
    - ``running_without_row``: a container runs that the store does not know
      (or knows as gone);
    - ``usable_not_running``: READY/CLAIMED in the store, no running container.
    """
    rows = store_rows(home)
    containers = runc_containers(home)
    states = collections.Counter(state for state, _, _ in rows.values())
    missing = [i for i in acked_creates if i not in rows]
    running_without_row = [
        i for i, running in containers.items() if running and rows.get(i, ("",))[0] not in LIVE
    ]
    usable_not_running = [
        i
        for i, (state, _, _) in rows.items()
        if state in ("READY", "CLAIMED") and not containers.get(i)
    ]
    return {
        "rows": len(rows),
        "states": dict(states),
        "containers": len(containers),
        "acked_creates": len(acked_creates),
        "missing_rows": missing[:10],
        "missing_rows_count": len(missing),
        "running_without_row": running_without_row[:10],
        "running_without_row_count": len(running_without_row),
        "usable_not_running": usable_not_running[:10],
        "usable_not_running_count": len(usable_not_running),
    }


def leaks(home: Path, sandbox_ids: set[str]) -> dict[str, int]:
    """What is left on the host of ``sandbox_ids`` (all zero when nothing leaked)."""
    mountinfo = Path("/proc/self/mountinfo").read_text()
    mounts = sum(1 for line in mountinfo.splitlines() if any(s in line for s in sandbox_ids))
    cgroups = sum(len(sandbox_cgroup_dirs(sandbox_id)) for sandbox_id in sandbox_ids)
    processes = 0
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cgroup = (entry / "cgroup").read_text()
        except OSError:
            continue
        if any(line.rsplit("/", 1)[-1] in sandbox_ids for line in cgroup.splitlines()):
            processes += 1
    netns_dir = Path("/run/netns")
    netns = (
        sum(1 for n in netns_dir.iterdir() if any(s in n.name for s in sandbox_ids))
        if netns_dir.exists()
        else 0
    )
    folders = sum(1 for s in sandbox_ids if (home / "sandboxes" / s).exists())
    rows = store_rows(home)
    live_rows = sum(1 for s in sandbox_ids if rows.get(s, ("",))[0] in LIVE)
    return {
        "processes": processes,
        "mounts": mounts,
        "cgroups": cgroups,
        "netns": netns,
        "sandbox_folders": folders,
        "runc_containers": len(set(runc_containers(home)) & sandbox_ids),
        "live_rows": live_rows,
    }
