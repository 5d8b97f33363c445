"""Faults under load: kill -9 each service, kill a sandbox's init, fill the disk, exhaust fds.

One real ``orchard up`` (home on a small tmpfs, so the disk can really fill)
with ``ORCHARD_FAULT_SANDBOXES`` (default 200) sandboxes and client threads
keeping execs, ``sleep`` execs, file writes and control-plane reads in flight
(``load.StackLoad``). Each test breaks one thing under that load and checks:

- every call in flight at the fault ended with a clear status (OK,
  UNAVAILABLE or the fault's own code) within its deadline (none hung: every
  call has a deadline; the worst overrun is measured);
- every sandbox is accounted for (every acknowledged create has a row, no
  container runs without a live row, every READY row has a running container);
- no acknowledged write is lost (read back byte for byte after recovery);
- the service comes back by itself: ``orchard up`` restarts a dead service on
  the same address (its supervision; see src/orchard/cli/_supervision.py).

The last test deletes everything and checks nothing is left (processes,
mounts, cgroups, netns, runc state, folders, live rows). Counts go to stdout
and to ``build/reliability/faults.json`` (docs/reliability.md quotes them).
The module holds the machine-wide heavy lock (it starts hundreds of sandboxes).
"""

from __future__ import annotations

import collections
import contextlib
import json
import os
import sqlite3
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from orchard import Orchard
from orchard.client import OrchardError
from tests.reliability.load import (
    CallOutcome,
    LoadMix,
    LoadSandbox,
    StackLoad,
    StackProcesses,
    account,
    heavy_lock,
    in_flight_summary,
    leaks,
    overall_summary,
    store_rows,
    wait_until,
)
from tests.stack import REQUIRES_STACK, Stack, running_stack

# The module's fixture waits for the machine-wide heavy lock (another engineer's
# 1000-sandbox run may hold it for minutes): that wait must not count as a hang.
pytestmark = [
    *REQUIRES_STACK,
    pytest.mark.reliability,
    pytest.mark.slow,
    pytest.mark.timeout(1200),
    pytest.mark.serial,  # hundreds of sandboxes under the heavy lock: alone (tests/phases.py)
]

SANDBOXES = int(os.environ.get("ORCHARD_FAULT_SANDBOXES", "200"))
THREADS = int(os.environ.get("ORCHARD_FAULT_THREADS", "16"))
SLEEPERS = 16
HOME_TMPFS_MIB = 256
RESULTS = Path(__file__).resolve().parents[2] / "build" / "reliability" / "faults.json"
MAX_OVERRUN_S = 0.5
"""A call may end this much after its deadline (thread wake-up on a busy 2-core box)."""
WARM_S = 1.5
AFTER_S = 1.5


@dataclass
class Faults:
    stack: Stack
    load: StackLoad
    processes: StackProcesses
    results: dict[str, Any] = field(default_factory=dict)

    @property
    def home(self) -> Path:
        return self.stack.home

    def save(self, name: str, result: dict[str, Any]) -> None:
        self.results[name] = result
        print(f"\nFAULT {name}: {json.dumps(result, sort_keys=True)}")
        RESULTS.parent.mkdir(parents=True, exist_ok=True)
        previous = json.loads(RESULTS.read_text()) if RESULTS.exists() else {}
        previous.update(self.results)
        RESULTS.write_text(json.dumps(previous, indent=2, sort_keys=True) + "\n")


@contextlib.contextmanager
def _tmpfs(path: Path, mib: int) -> Iterator[None]:
    path.mkdir(parents=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={mib}m", "tmpfs", str(path)], check=True)
    try:
        yield
    finally:
        if subprocess.run(["umount", str(path)], check=False).returncode != 0:
            subprocess.run(["umount", "-l", str(path)], check=False)


@pytest.fixture(scope="module")
def faults(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Faults]:
    home = tmp_path_factory.mktemp("faults") / "home"
    with heavy_lock() as waited, _tmpfs(home, HOME_TMPFS_MIB), running_stack(home) as stack:
        key = (home / "dev-api-key").read_text().strip()
        load = StackLoad(stack.endpoint, key, threads=THREADS, mix=LoadMix(sleepers=SLEEPERS))
        started = time.monotonic()
        made = load.create_many(SANDBOXES)
        created_s = time.monotonic() - started
        assert len(made) == SANDBOXES, overall_summary(load.outcomes)
        print(f"\n{SANDBOXES} sandboxes in {created_s:.1f} s (waited {waited:.1f} s for the lock)")
        try:
            yield Faults(stack, load, StackProcesses(stack.process.pid))
        finally:
            load.stop()
            load.close()


# ---- one fault round ------------------------------------------------------------


@dataclass
class CreateBurst:
    """Creates started just before a fault (so some are in flight), each with a request id."""

    load: StackLoad
    count: int
    made: dict[str, LoadSandbox | None] = field(default_factory=dict)
    threads: list[threading.Thread] = field(default_factory=list)

    def start(self) -> None:
        def one(request_id: str) -> None:
            self.made[request_id] = self.load.create(request_id=request_id)

        for _ in range(self.count):
            request_id = f"fault-{os.urandom(6).hex()}"
            thread = threading.Thread(target=one, args=(request_id,), daemon=True)
            thread.start()
            self.threads.append(thread)

    def join(self) -> None:
        for thread in self.threads:
            thread.join(70)

    def retry_failed(self) -> dict[str, Any]:
        """Retry every create that failed, with the same request id, once the stack is back:
        the client learns what became of it (the same sandbox, or a clear FAILED)."""
        failed = [r for r, box in self.made.items() if box is None]
        before = len(self.load.outcomes)
        same = 0
        for request_id in failed:
            box = self.load.create(request_id=request_id)
            if box is not None:
                same += 1
                self.load.sandboxes.append(box)
        codes = collections.Counter(o.code for o in self.load.outcomes[before:])
        for box in self.made.values():
            if box is not None:
                self.load.sandboxes.append(box)
        return {"creates": self.count, "failed": len(failed), "retried_ok": same,
                "retry_codes": dict(codes)}  # fmt: skip


def _round_checks(
    faults: Faults, fault_at: float, back_at: float, clear: set[str], round_start: float
) -> dict[str, Any]:
    load = faults.load
    outcomes = load.outcomes_since(round_start)
    flight = in_flight_summary(outcomes, fault_at, clear)
    during = [o for o in outcomes if fault_at <= o.started < back_at]
    unclear_any = [o for o in outcomes if o.code not in clear]
    after = [o for o in outcomes if o.started >= back_at + 0.5]
    return {
        "in_flight_at_fault": flight,
        "calls_in_round": overall_summary(outcomes),
        "during_outage": overall_summary(during),
        "after_recovery": overall_summary(after),
        "unclear_in_round": [f"{o.op} {o.code}: {o.detail[:120]}" for o in unclear_any][:10],
        "unclear_in_round_count": len(unclear_any),
        "recovered_after_s": round(back_at - fault_at, 3),
        "started_per_half_second": _timeline(outcomes, fault_at),
    }


def _timeline(outcomes: list[CallOutcome], fault_at: float) -> dict[str, str]:
    """Calls started per 0.5 s around the fault, as "ok/failed" (shows the outage's shape)."""
    bins: dict[float, list[int]] = {}
    for o in outcomes:
        key = (o.started - fault_at) // 0.5 * 0.5
        counts = bins.setdefault(key, [0, 0])
        counts[o.code != "OK"] += 1
    return {f"{k:+.1f}": f"{v[0]}/{v[1]}" for k, v in sorted(bins.items())}


def _assert_round(result: dict[str, Any]) -> None:
    flight = result["in_flight_at_fault"]
    assert flight["in_flight"] > 0, "no call was in flight at the fault: the test proved nothing"
    assert flight["unclear_count"] == 0, flight["unclear"]
    assert result["unclear_in_round_count"] == 0, result["unclear_in_round"]
    assert result["calls_in_round"]["max_overrun_s"] <= MAX_OVERRUN_S, result["calls_in_round"]
    after = result["after_recovery"]
    assert after["calls"] > 0 and set(after["codes"]) == {"OK"}, after


def _assert_accounted(faults: Faults) -> dict[str, Any]:
    accounted = account(faults.home, faults.load.acked_creates)
    assert accounted["missing_rows_count"] == 0, accounted
    assert accounted["running_without_row_count"] == 0, accounted
    assert accounted["usable_not_running_count"] == 0, accounted
    return accounted


def _usable_ids(faults: Faults) -> set[str]:
    rows = store_rows(faults.home)
    return {b.id for b in faults.load.sandboxes if rows.get(b.id, ("",))[0] == "READY"}


def _kill_service_round(faults: Faults, service: str, probe_ops: set[str]) -> dict[str, Any]:
    load = faults.load
    round_start = time.monotonic()
    load.start()
    time.sleep(WARM_S)
    # An SDK client too, with its channels made before the fault: it must resume by itself.
    sdk_box = Orchard(load.endpoint, load.api_key).sandboxes.connect(load.sandboxes[-1].id)
    sdk_call = (lambda: sdk_box.exec("true")) if service == "executor" else sdk_box.info
    sdk_call()
    burst = CreateBurst(load, 8)
    burst.start()
    time.sleep(0.05)
    fault_at = time.monotonic()
    old = faults.processes.kill(service)
    new = faults.processes.wait_restarted(service, old)
    restarted_at = time.monotonic()
    addr_file = faults.home / "run" / f"{service}.addr"
    killed_wall = time.time() - (restarted_at - fault_at)
    assert wait_until(lambda: addr_file.exists() and addr_file.stat().st_mtime > killed_wall, 30)
    serving_at = time.monotonic()

    def sdk_ok() -> bool:
        try:
            sdk_call()
        except OrchardError:
            return False
        return True

    assert wait_until(sdk_ok, 30)
    sdk_back_at = time.monotonic()
    assert wait_until(lambda: load.first_ok_after(restarted_at, probe_ops) is not None, 30)
    back_at = restarted_at + (load.first_ok_after(restarted_at, probe_ops) or 0.0)
    time.sleep(AFTER_S)
    load.stop()
    burst.join()
    result = _round_checks(faults, fault_at, back_at, {"OK", "UNAVAILABLE"}, round_start)
    result["creates_in_flight_retried"] = burst.retry_failed()
    result["pids"] = {"killed": old, "restarted": new}
    result["serving_after_s"] = round(serving_at - fault_at, 3)
    result["sdk_resumed_after_s"] = round(sdk_back_at - fault_at, 3)
    result["new_process_after_s"] = round(restarted_at - fault_at, 3)
    result["accounted"] = _assert_accounted(faults)
    result["writes"] = load.verify_writes(_usable_ids(faults))
    return result


# ---- the faults ----------------------------------------------------------------------


def test_kill_9_gateway_under_load(faults: Faults) -> None:
    """Control-plane calls in flight get UNAVAILABLE; the data plane never notices."""
    result = _kill_service_round(faults, "gateway", {"get"})
    faults.save("kill_gateway", result)
    _assert_round(result)
    assert result["writes"]["lost"] == 0, result["writes"]


def test_kill_9_executor_under_load(faults: Faults) -> None:
    """Execs in flight get UNAVAILABLE; the restarted executor finds every sandbox again."""
    result = _kill_service_round(faults, "executor", {"exec", "write"})
    faults.save("kill_executor", result)
    _assert_round(result)
    assert result["in_flight_at_fault"]["codes"].get("UNAVAILABLE", 0) > 0, result
    assert result["writes"]["lost"] == 0, result["writes"]
    assert result["writes"]["acked_writes_checked"] > 0


def test_kill_9_scheduler_under_load(faults: Faults) -> None:
    """Creates and reads in flight get UNAVAILABLE; recovery adopts every running sandbox."""
    result = _kill_service_round(faults, "scheduler", {"get"})
    faults.save("kill_scheduler", result)
    _assert_round(result)
    assert result["writes"]["lost"] == 0, result["writes"]


def test_kill_9_a_sandbox_init(faults: Faults) -> None:
    """The sandbox goes FAILED (infrastructure) within seconds; its neighbours never notice."""
    load = faults.load
    victim = load.sandboxes[0]
    meta = json.loads((faults.home / "sandboxes" / victim.id / "sandbox.json").read_text())
    round_start = time.monotonic()
    load.excluded.add(victim.id)
    load.start()
    in_flight = threading.Thread(
        target=load.run, args=(victim, "sleep 5", 6.0, 8.0, "victim_exec"), daemon=True
    )
    in_flight.start()
    time.sleep(WARM_S)
    fault_at = time.monotonic()
    os.kill(int(meta["init_pid"]), 9)
    in_flight.join(10)

    def failed() -> bool:
        return store_rows(faults.home)[victim.id][0] == "FAILED"

    assert wait_until(failed, 15), store_rows(faults.home)[victim.id]
    marked_after = time.monotonic() - fault_at
    state, fault, reason = store_rows(faults.home)[victim.id]
    after_calls = [
        load.run(victim, "true", 5, 10, "victim_exec"),
        load.write(victim, "/tmp/after", b"x", 10),
        load.get(victim.id, 10),
    ]
    time.sleep(AFTER_S)
    load.stop()
    back_at = fault_at + marked_after
    clear = {"OK", "UNAVAILABLE", "FAILED_PRECONDITION", "NOT_FOUND"}
    result = _round_checks(faults, fault_at, back_at, clear, round_start)
    victim_calls = [o for o in load.outcomes_since(round_start) if o.sandbox_id == victim.id]
    neighbours = [
        o for o in load.outcomes_since(round_start) if o.sandbox_id not in ("", victim.id)
    ]
    got = after_calls[2]
    result.update(
        {
            "marked_failed_after_s": round(marked_after, 3),
            "victim": {"state": state, "fault": fault, "reason": reason},
            "victim_get_state": int(got.state) if got is not None else None,
            "victim_calls": overall_summary(victim_calls),
            "neighbour_calls": overall_summary(neighbours),
        }
    )
    # Its resources go when it is deleted (by its owner or its TTL).
    assert load.delete(victim.id)
    deleted_at = time.monotonic()
    wait_until(lambda: sum(leaks(faults.home, {victim.id}).values()) == 0, 20, 0.2)
    result["victim_leaks_after_delete"] = leaks(faults.home, {victim.id})
    result["victim_resources_gone_after_s"] = round(time.monotonic() - deleted_at, 3)
    load.sandboxes.remove(victim)
    result["accounted"] = _assert_accounted(faults)
    faults.save("kill_sandbox_init", result)
    assert (state, fault) == ("FAILED", "infrastructure"), result["victim"]
    assert result["in_flight_at_fault"]["unclear_count"] == 0, result["in_flight_at_fault"]
    victim_codes = set(result["victim_calls"]["codes"])
    assert victim_codes <= clear and victim_codes - {"OK"}, result["victim_calls"]
    assert set(result["neighbour_calls"]["codes"]) == {"OK"}, result["neighbour_calls"]
    assert result["victim_leaks_after_delete"] == dict.fromkeys(
        result["victim_leaks_after_delete"], 0
    )


def _executor_fds(faults: Faults) -> int:
    return len(os.listdir(f"/proc/{faults.processes.pid('executor')}/fd"))


FD_HOG = (
    "import os, time\n"
    "fds = []\n"
    "try:\n"
    "    while True: fds.append(os.open('/dev/null', os.O_RDONLY))\n"
    "except OSError as e: print(len(fds), e.errno, flush=True)\n"
)


def test_fd_exhaustion_in_a_sandbox(faults: Faults) -> None:
    """A command that opens fds until EMFILE gets a plain result; a sandbox holding its
    whole RLIMIT_NOFILE keeps answering; others are unaffected; the executor leaks no fd."""
    load = faults.load
    hog, other = load.sandboxes[0], load.sandboxes[1]
    load.run(other, "true", 5, 10, "warm")
    fds_before = _executor_fds(faults)
    round_start = time.monotonic()
    load.start()
    time.sleep(WARM_S)
    fault_at = time.monotonic()
    until_emfile = load.run(hog, f'python3 -c "{FD_HOG}"', 20, 30, "fd_hog")
    # A process left holding every fd its limit allows, while the executor keeps talking to the sandbox.
    load.run(
        hog, f'nohup python3 -c "{FD_HOG}time.sleep(20)" >/tmp/hog.out 2>&1 &', 5, 10, "fd_hog"
    )
    assert wait_until(lambda: b" 24" in (load.read(hog, "/tmp/hog.out") or b""), 15)
    during = [
        load.run(hog, "echo still here", 5, 10, "fd_hog_exec"),
        load.write(hog, "/tmp/while-full", b"acknowledged", 10),
        load.read(hog, "/tmp/while-full"),
        load.run(other, "echo neighbour", 5, 10, "neighbour_exec"),
    ]
    time.sleep(AFTER_S)
    load.stop()
    load.run(hog, "pkill -f time.sleep || true", 5, 10, "fd_hog_cleanup")
    time.sleep(0.5)
    fds_after = _executor_fds(faults)
    result = _round_checks(faults, fault_at, fault_at, {"OK"}, round_start)
    result.update(
        {
            "emfile_command": {
                "exit_code": until_emfile.status.exit_code if until_emfile else None,
                "stdout": until_emfile.stdout.decode()[:80] if until_emfile else None,
            },
            "while_hog_holds_all_fds": {
                "exec": during[0].stdout.decode() if during[0] else None,
                "write_acked": during[1],
                "read_back": during[2],
                "neighbour": during[3].stdout.decode() if during[3] else None,
            },
            "executor_fds": {"before": fds_before, "after": fds_after},
        }
    )
    result["while_hog_holds_all_fds"]["read_back"] = (
        during[2].decode() if isinstance(during[2], bytes) else None
    )
    faults.save("fd_exhaustion", result)
    assert until_emfile is not None and until_emfile.status.exit_code == 0
    assert until_emfile.stdout.split()[1] == b"24", until_emfile.stdout  # EMFILE
    assert during[0] is not None and during[0].stdout == b"still here\n"
    assert during[1] and during[2] == b"acknowledged"
    assert during[3] is not None and during[3].stdout == b"neighbour\n"
    assert result["unclear_in_round_count"] == 0, result["unclear_in_round"]
    assert fds_after <= fds_before + 2, result["executor_fds"]


def _fill(filler: Path) -> None:
    """Append to ``filler`` until the filesystem has no block left."""
    with open(filler, "ab", buffering=0) as out:
        for size in (1 << 20, 4096, 1):
            with contextlib.suppress(OSError):
                while True:
                    out.write(b"\0" * size)


def test_disk_full_in_the_data_directory(faults: Faults) -> None:
    """Creates and writes get RESOURCE_EXHAUSTED (a message saying the disk is full), the
    store stays intact, and after freeing space everything works again."""
    load = faults.load
    box = load.sandboxes[2]
    filler = faults.home / "filler"
    round_start = time.monotonic()
    _fill(filler)
    fault_at = time.monotonic()
    full_create = load.create(deadline=30)
    _fill(filler)  # whatever the failed create gave back
    # A sandbox's writable layer is its own tmpfs (backends/local/scratch.py), not the
    # data directory: its file writes may go on; any refusal must say the disk is full.
    full_writes = [
        load.write(box, f"/var/tmp/full-{i}.bin", os.urandom(1 << 20), 10) for i in range(4)
    ]
    full_write = all(full_writes)
    gone = load.sandboxes[3]
    full_delete = load.delete(gone.id)
    full_exec = load.run(box, "echo still runs", 5, 10, "exec")
    with contextlib.closing(
        sqlite3.connect(f"file:{faults.home / 'state.db'}?mode=ro", uri=True)
    ) as db:
        integrity = db.execute("PRAGMA integrity_check").fetchone()[0]
    filler.unlink()
    back_at = time.monotonic()
    after_create = load.create(deadline=30)
    after_write = load.write(box, "/var/tmp/after-full.bin", b"space again", 10)
    outcomes = load.outcomes_since(round_start)
    failed = [o for o in outcomes if o.started < back_at and o.code != "OK"]
    result = {
        "while_full": {
            "create": full_create.id if full_create else None,
            "write_acked": full_write,
            "writes_acked_of_4": sum(full_writes),
            "delete_ok": full_delete,
            "exec_ok": full_exec is not None,
            "failures": [f"{o.op} {o.code}: {o.detail[:160]}" for o in failed],
        },
        "store_integrity": integrity,
        "after_freeing": {
            "create_ok": after_create is not None,
            "write_ok": after_write,
        },
        "calls_in_round": overall_summary(outcomes),
        "recovered_after_s": round(back_at - fault_at, 3),
    }
    if after_create is not None:
        load.sandboxes.append(after_create)
    if full_delete:
        load.sandboxes.remove(gone)
    result["accounted"] = _assert_accounted(faults)
    result["writes"] = load.verify_writes({box.id})
    faults.save("disk_full", result)
    assert integrity == "ok"
    assert full_create is None, result["while_full"]
    assert {o.code for o in failed} == {"RESOURCE_EXHAUSTED"}, result["while_full"]
    assert all("space" in o.detail or "disk" in o.detail for o in failed), result["while_full"]
    assert after_create is not None and after_write, result["after_freeing"]
    assert result["writes"]["lost"] == 0


def test_delete_everything_leaves_nothing(faults: Faults) -> None:
    """After the faults, deleting every sandbox (the client's and the orphans the faults made:
    a create the gateway finished after its client got UNAVAILABLE) leaves nothing behind."""
    load = faults.load
    rows = store_rows(faults.home)
    every = set(rows) | {b.id for b in load.sandboxes}
    live = [i for i, (state, _, _) in rows.items() if state in ("READY", "CLAIMED", "FAILED")]
    load.sandboxes = [LoadSandbox(i, "", "") for i in live]
    deleted = load.delete_all()
    started = time.monotonic()
    wait_until(lambda: sum(leaks(faults.home, every).values()) == 0, 30, 0.25)
    left = leaks(faults.home, every)
    result = {
        "deleted": deleted,
        "of": len(live),
        "sandboxes_ever": len(every),
        "leaks": left,
        "teardown_done_after_s": round(time.monotonic() - started, 2),
        "left_ids": sorted(i for i in every if (faults.home / "sandboxes" / i).exists())[:5],
        "left_rows": {
            i: row for i, row in store_rows(faults.home).items() if row[0] not in ("DELETED",)
        },
    }
    faults.save("delete_all", result)
    assert deleted == len(live)
    assert left == dict.fromkeys(left, 0), left
