"""A bounded soak: create -> a few execs + a file write/read -> delete, over and over.

Runs ``orchard up`` in a temporary home (or uses ``--endpoint``/``--home`` of a
running stack) and keeps ``--concurrency`` workers cycling for ``--minutes``
(and at most ``--max-cycles``). Every ``--sample-seconds`` it samples the
host's MemAvailable, the stack's processes' RSS and open fds, the host's mount
count, the orchard cgroup count and the store's row count. At the end it
prints JSON: per resource the first and last samples and the least-squares
slope per minute over the second half of the run (the first half includes the
warm-up: imports, caches, SQLite growing to its working size), and exits
non-zero if any resource grows beyond its stated bound (``BOUNDS``) or any
cycle failed.

    make soak SOAK_MINUTES=20      # under flock /tmp/orchard-heavy.lock
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from orchard import Orchard
from tests.cgroup_paths import cgroup_names_a_sandbox, count_sandbox_cgroups

BOUNDS: dict[str, float] = {
    # Slopes (per minute, over the second half of the run) a leak would exceed. The
    # services are measured one by one (orchard up's direct children): runc
    # processes come and go under the scheduler and would only add noise.
    "rss_mib_executor": 2.0,
    "rss_mib_scheduler": 2.0,
    "rss_mib_gateway": 2.0,
    "fds_executor": 1.0,
    "fds_scheduler": 1.0,
    "fds_gateway": 1.0,
    "leaked_mounts": 0.1,
    "leaked_cgroups": 0.1,
    "live_rows": 0.5,
    # Reported, not bounded: host_mem_available_mib (the machine is shared, other
    # engineers' runs move it) and store_rows (DELETED rows are kept a day on purpose).
}
"""Growth per minute beyond which the soak fails (negative: the most it may fall)."""

END_BOUNDS: dict[str, float] = {
    # After the last delete, the end sample minus the start sample may be at most:
    "mounts": 0,
    "orchard_cgroups": 0,
    "leaked_mounts": 0,
    "leaked_cgroups": 0,
    "live_rows": 0,
    "init_processes": 0,
}


MAX_FAILURES = 20
"""A soak that fails this often is broken, not leaking: stop early and say so."""


@dataclass
class Stats:
    cycles: int = 0
    failures: int = 0
    errors: list[str] = field(default_factory=list)
    cycle_seconds: list[float] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)


def _read_meminfo() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) // 1024
    return 0


def _descendants(pid: int) -> list[int]:
    found: list[int] = []
    with contextlib.suppress(FileNotFoundError):
        for task in Path(f"/proc/{pid}/task").iterdir():
            with contextlib.suppress(FileNotFoundError):
                for child in (task / "children").read_text().split():
                    found.append(int(child))
                    found.extend(_descendants(int(child)))
    return found


def _stack_pids(up_pid: int) -> list[int]:
    """orchard up and its service processes (not the sandboxes: they are not its children)."""
    return [up_pid, *_descendants(up_pid)]


def _rss_and_fds(pids: list[int]) -> tuple[int, int]:
    rss_kib = fds = 0
    for pid in pids:
        with contextlib.suppress(OSError):
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    rss_kib += int(line.split()[1])
            fds += len(os.listdir(f"/proc/{pid}/fd"))
    return rss_kib // 1024, fds


def _by_service(up_pid: int) -> dict[str, float]:
    """RSS and open fds of each service (``rss_mib_executor``, ``fds_executor``, ...):
    orchard up's direct children, so which one leaks shows, if one does."""
    found: dict[str, float] = {}
    children: list[int] = []
    with contextlib.suppress(FileNotFoundError):
        for task in Path(f"/proc/{up_pid}/task").iterdir():
            with contextlib.suppress(FileNotFoundError):
                children.extend(int(c) for c in (task / "children").read_text().split())
    for pid in children:
        with contextlib.suppress(OSError):
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            if b"-m" not in argv:
                continue
            name = argv[argv.index(b"-m") + 1].decode().rsplit(".", 1)[-1]
            found[f"fds_{name}"] = len(os.listdir(f"/proc/{pid}/fd"))
            rss, _ = _rss_and_fds([pid])
            found[f"rss_mib_{name}"] = rss
    return found


def _leaked(home: Path, deleted: set[str]) -> tuple[int, int]:
    """(mounts, cgroups) still there of sandboxes the store says are DELETED."""
    mountinfo = Path("/proc/self/mountinfo").read_text()
    prefix = str(home / "sandboxes") + "/"
    mounts = sum(
        1
        for line in mountinfo.splitlines()
        if prefix in line and line.split(prefix, 1)[1].split("/", 1)[0] in deleted
    )
    return mounts, count_sandbox_cgroups(deleted)


def _orchard_cgroups(ids: set[str]) -> int:
    """Cgroups left of this stack's sandboxes (``ids``: every id its store ever had); other
    stacks on the machine have their own, which must not count here."""
    return count_sandbox_cgroups(ids)


def _init_processes(home: Path) -> int:
    """orchard-init processes of this home's sandboxes (their cgroup names a sandbox folder here)."""
    ids = (
        {e.name for e in (home / "sandboxes").iterdir()} if (home / "sandboxes").exists() else set()
    )
    if not ids:
        return 0
    count = 0
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                cgroup = (entry / "cgroup").read_text()
                count += cgroup_names_a_sandbox(cgroup, ids)
    return count


def _store_ids(home: Path) -> tuple[set[str], set[str]]:
    """(every id in the store, the DELETED ones)."""
    with contextlib.closing(
        sqlite3.connect(f"file:{home / 'state.db'}?mode=ro", uri=True, timeout=10)
    ) as db:
        rows = db.execute("SELECT id, state FROM sandboxes").fetchall()
    return {r[0] for r in rows}, {r[0] for r in rows if r[1] == 4}


def sample(home: Path, up_pid: int, started: float) -> dict[str, float]:
    rss, fds = _rss_and_fds(_stack_pids(up_pid))
    ids, deleted = _store_ids(home)
    live = len(ids) - len(deleted)
    leaked_mounts, leaked_cgroups = _leaked(home, deleted)
    mountinfo = Path("/proc/self/mountinfo").read_text().splitlines()
    return {
        "t_s": round(time.monotonic() - started, 1),
        "host_mem_available_mib": _read_meminfo(),
        "stack_rss_mib": rss,
        "stack_fds": fds,
        **_by_service(up_pid),
        "leaked_mounts": leaked_mounts,
        "leaked_cgroups": leaked_cgroups,
        "mounts": sum(1 for line in mountinfo if str(home) in line),
        "orchard_cgroups": _orchard_cgroups(ids),
        "store_rows": len(ids),
        "live_rows": live,
        "init_processes": _init_processes(home),
    }


def slope_per_minute(samples: list[dict[str, float]], key: str) -> float:
    """Least-squares slope of ``key`` against time over the second half of the samples."""
    half = samples[len(samples) // 2 :]
    if len(half) < 2:
        return 0.0
    xs = [s["t_s"] / 60 for s in half]
    ys = [s[key] for s in half]
    if len(set(xs)) < 2:
        return 0.0
    return float(statistics.linear_regression(xs, ys).slope)


def _cycle(endpoint: str, key: str, stats: Stats, index: int) -> None:
    started = time.monotonic()
    try:
        with Orchard(endpoint, key).sandboxes.create(timeout=60, ttl=600) as box:
            for command in ("true", "echo soak", "ls /"):
                result = box.exec(command, timeout=30)
                if result.exit_code != 0:
                    raise RuntimeError(f"{command!r} exited {result.exit_code}")
            payload = f"soak cycle {index}\n".encode() * 64
            box.write_file("/tmp/soak.txt", payload)
            if box.read_file("/tmp/soak.txt") != payload:
                raise RuntimeError("read back different bytes")
    except Exception as exc:
        with stats.lock:
            stats.failures += 1
            if len(stats.errors) < 20:
                stats.errors.append(f"{type(exc).__name__}: {exc}"[:300])
        return
    with stats.lock:
        stats.cycles += 1
        stats.cycle_seconds.append(time.monotonic() - started)


def _worker(
    endpoint: str, key: str, stats: Stats, stop: threading.Event, budget: Iterator[int]
) -> None:
    while not stop.is_set() and stats.failures < MAX_FAILURES:
        index = next(budget, None)
        if index is None:
            return
        _cycle(endpoint, key, stats, index)


@contextlib.contextmanager
def _own_stack(home: Path) -> Iterator[tuple[str, int]]:
    """``orchard up --port 0`` in ``home``: (endpoint, its pid); stopped by pid on exit."""
    env = {**os.environ, "ORCHARD_HOME": str(home)}
    env.setdefault("ORCHARD_IMAGES_DIR", "/var/lib/orchard/images")
    process = subprocess.Popen(
        [sys.executable, "-m", "orchard.cli", "up", "--port", "0", "--http-port", "-1"],
        env=env,
        stdout=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
    )
    assert process.stdout is not None
    try:
        endpoint = ""
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            line = process.stdout.readline().decode()
            if not line:
                break
            if line.startswith("Orchard is up. Endpoint: "):
                endpoint = line.rsplit(" ", 1)[1].strip()
                break
        if not endpoint:
            raise RuntimeError("orchard up did not come up")
        yield endpoint, process.pid
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(120)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        process.stdout.close()


def run(args: argparse.Namespace) -> dict[str, Any]:
    home = Path(args.home) if args.home else Path(tempfile.mkdtemp(prefix="orchard-soak-"))
    try:
        return _soak(args, home)
    finally:
        if not args.home:
            shutil.rmtree(home, ignore_errors=True)


def _soak(args: argparse.Namespace, home: Path) -> dict[str, Any]:
    with _own_stack(home) as (endpoint, up_pid):
        key = (home / "dev-api-key").read_text().strip()
        stats = Stats()
        stop = threading.Event()
        budget = iter(range(args.max_cycles))
        budget_lock = threading.Lock()

        def take() -> Iterator[int]:
            while True:
                with budget_lock:
                    index = next(budget, None)
                if index is None:
                    return
                yield index

        started = time.monotonic()
        samples = [sample(home, up_pid, started)]
        workers = [
            threading.Thread(target=_worker, args=(endpoint, key, stats, stop, take()), daemon=True)
            for _ in range(args.concurrency)
        ]
        for w in workers:
            w.start()
        end = started + args.minutes * 60
        while time.monotonic() < end and any(w.is_alive() for w in workers):
            time.sleep(min(args.sample_seconds, max(0.0, end - time.monotonic())))
            samples.append(sample(home, up_pid, started))
        stop.set()
        for w in workers:
            w.join(120)
        time.sleep(3)  # deletes answer before the teardown ends (asynchronous teardown)
        final = sample(home, up_pid, started)
        samples.append(final)
    first = samples[0]
    report: dict[str, Any] = {
        "minutes": round((time.monotonic() - started) / 60, 2),
        "concurrency": args.concurrency,
        "cycles": stats.cycles,
        "failures": stats.failures,
        "errors": stats.errors,
        "cycle_p50_s": round(statistics.median(stats.cycle_seconds), 3)
        if stats.cycle_seconds
        else None,
        "samples": len(samples),
        "resources": {},
        "violations": [],
    }
    for key_name in first:
        if key_name == "t_s":
            continue
        slope = slope_per_minute(samples[:-1], key_name)
        report["resources"][key_name] = {
            "start": first[key_name],
            "end": final[key_name],
            "min": min(s[key_name] for s in samples),
            "max": max(s[key_name] for s in samples),
            "slope_per_min_second_half": round(slope, 3),
        }
        bound = BOUNDS.get(key_name)
        if bound is not None and ((bound >= 0 and slope > bound) or (bound < 0 and slope < bound)):
            report["violations"].append(f"{key_name}: slope {slope:.3f}/min beyond {bound}/min")
        end_bound = END_BOUNDS.get(key_name)
        if end_bound is not None and final[key_name] - first[key_name] > end_bound:
            report["violations"].append(
                f"{key_name}: {first[key_name]} at start, {final[key_name]} at the end"
            )
    if stats.failures:
        report["violations"].append(f"{stats.failures} cycles failed")
    if args.samples_out:
        Path(args.samples_out).write_text(json.dumps(samples, indent=1))
    report["bounds"] = {"slope_per_min": BOUNDS, "end_minus_start": END_BOUNDS}
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--minutes", type=float, default=20.0)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--max-cycles", type=int, default=1_000_000)
    parser.add_argument("--sample-seconds", type=float, default=10.0)
    parser.add_argument("--home", default=None, help="node home (default: a new temp folder)")
    parser.add_argument("--samples-out", default=None, help="write every sample here (JSON)")
    args = parser.parse_args(argv)
    report = run(args)
    print(json.dumps(report, indent=2))
    return 1 if report["violations"] else 0


if __name__ == "__main__":
    sys.exit(main())
