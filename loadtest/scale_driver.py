"""Scale driver: N concurrent create -> 4 execs -> delete through the async SDK, one JSON line out.

The scenario of issue 5 (the original's four commands, default image,
network policy ``none``), all N users at once, against a real ``orchard up``
started in a temporary home (``tests/stack.py``), or an endpoint given with
``--endpoint``/``--api-key``. Modes:

- ``cold``: every user creates a sandbox from scratch.
- ``warm``: a template whose pool is pre-filled to N first; users claim from it.
- ``idle``: create N, hold them idle, measure memory per sandbox (PSS of every
  process in the sandboxes' cgroups, the node executor's growth, MemAvailable
  delta), then delete them. No execs.

Printed: success count, wall time, per-operation p50/p90/p99 (ms), the time at
which the last create / last exec / last delete finished (phases overlap: every
user runs its own chain), peak host memory used, and what was left behind
(sandbox processes, overlay mounts and cgroups of the temp home).

    flock /tmp/orchard-heavy.lock .venv/bin/python loadtest/scale_driver.py --n 1000 --mode cold
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import orchard
from tests.stack import running_stack

COMMANDS = (
    """python3 -c 'import sys; print(f"Python {sys.version}")'""",
    "ls /",
    "sh -c 'cat /etc/os-release | head -1'",
    "bash -lc 'cat /etc/os-release | head -1'",
)
MEMORY_CGROUP = Path("/sys/fs/cgroup/memory/orchard")
MIB = 1 << 20


@dataclass
class Run:
    started: float = field(default_factory=time.perf_counter)
    ops: dict[str, list[float]] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)
    finished: dict[str, float] = field(default_factory=dict)
    ok: int = 0

    def record(self, op: str, t0: float) -> None:
        now = time.perf_counter()
        self.ops.setdefault(op, []).append((now - t0) * 1000)
        self.finished[op] = max(self.finished.get(op, 0.0), now - self.started)


def percentiles(samples: list[float]) -> dict[str, float]:
    ordered = sorted(samples)

    def pick(q: float) -> float:
        return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))], 2)

    return {
        "n": len(ordered),
        "p50": round(statistics.median(ordered), 2),
        "p90": pick(0.90),
        "p99": pick(0.99),
        "max": round(ordered[-1], 2),
    }


def mem_available() -> int:
    with open("/proc/meminfo") as src:
        for line in src:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no MemAvailable")


def meminfo(keys: tuple[str, ...]) -> dict[str, int]:
    out: dict[str, int] = {}
    with open("/proc/meminfo") as src:
        for line in src:
            name, _, rest = line.partition(":")
            if name in keys:
                out[name] = int(rest.split()[0]) * 1024
    return out


def pss_of(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/smaps_rollup") as src:
            for line in src:
                if line.startswith("Pss:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def sandbox_pids(sandbox_ids: list[str]) -> list[int]:
    pids: list[int] = []
    for sid in sandbox_ids:
        with suppress(OSError):
            pids += [int(p) for p in (MEMORY_CGROUP / sid / "cgroup.procs").read_text().split()]
    return pids


def pid_of_service(home: Path, module: str) -> int:
    """The pid of ``python -m <module>`` started for ``home`` (found through /proc)."""
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            cmd = Path(f"/proc/{entry.name}/cmdline").read_bytes().split(b"\0")
            env = Path(f"/proc/{entry.name}/environ").read_bytes()
        except OSError:
            continue
        if module.encode() in cmd and f"ORCHARD_HOME={home}".encode() in env:
            return int(entry.name)
    return 0


def cpu_seconds(pid: int) -> dict[str, float]:
    """utime+stime of ``pid`` and of its waited-for children (runc runs as the scheduler's)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return {"self": 0.0, "children": 0.0}
    tick = os.sysconf("SC_CLK_TCK")
    return {
        "self": (int(fields[11]) + int(fields[12])) / tick,
        "children": (int(fields[13]) + int(fields[14])) / tick,
    }


def sandboxes_cpu() -> float:
    """CPU seconds charged to every sandbox ever (cpuacct of the parent cgroup keeps the dead's)."""
    try:
        return int(Path("/sys/fs/cgroup/cpuacct/orchard/cpuacct.usage").read_text()) / 1e9
    except (OSError, ValueError):
        return 0.0


class ServiceCpu:
    """CPU seconds each stack process (and its children) spent during the run."""

    SERVICES = ("orchard.gateway", "orchard.scheduler", "orchard.executor")

    def __init__(self, home: Path) -> None:
        self.pids = {name: pid_of_service(home, name) for name in self.SERVICES}
        self.before = {name: cpu_seconds(pid) for name, pid in self.pids.items()}
        self.driver_before = os.times()
        self.sandboxes_before = sandboxes_cpu()

    def used(self, n: int) -> dict[str, float]:
        """Milliseconds of CPU per sandbox, by process (``+children``: what it waited for)."""
        out: dict[str, float] = {}
        for name, pid in self.pids.items():
            now = cpu_seconds(pid)
            short = name.split(".")[1]
            out[short] = round((now["self"] - self.before[name]["self"]) / n * 1000, 2)
            out[f"{short}+children"] = round(
                (now["children"] - self.before[name]["children"]) / n * 1000, 2
            )
        t = os.times()
        driver = (t.user + t.system) - (self.driver_before.user + self.driver_before.system)
        out["driver"] = round(driver / n * 1000, 2)
        out["in_sandboxes"] = round((sandboxes_cpu() - self.sandboxes_before) / n * 1000, 2)
        return out


class PeakMemory:
    """Lowest MemAvailable seen while the run goes (sampled every 100 ms)."""

    def __init__(self) -> None:
        self.baseline = mem_available()
        self.lowest = self.baseline
        self._task: asyncio.Task[None] | None = None

    async def _sample(self) -> None:
        while True:
            self.lowest = min(self.lowest, mem_available())
            await asyncio.sleep(0.1)

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._sample())

    def stop(self) -> int:
        if self._task is not None:
            self._task.cancel()
        return self.baseline - self.lowest


async def one_user(
    run: Run, client: orchard.AsyncOrchard, template: str, gate: asyncio.Event
) -> None:
    await gate.wait()
    try:
        t0 = time.perf_counter()
        if template:
            sb = await client.sandboxes.create(template=template, timeout=300)
        else:
            sb = await client.sandboxes.create(network="none", timeout=300)
        run.record("create", t0)
        try:
            for i, cmd in enumerate(COMMANDS):
                t0 = time.perf_counter()
                result = await sb.exec(cmd, timeout=120)
                run.record(f"exec{i + 1}", t0)
                run.record("exec", t0)
                if result.exit_code != 0:
                    raise RuntimeError(f"{cmd!r} exited {result.exit_code}: {result.stderr_text}")
        finally:
            t0 = time.perf_counter()
            await sb.delete()
            run.record("delete", t0)
        run.ok += 1
    except Exception as exc:
        run.errors.append(f"{type(exc).__name__}: {exc}"[:300])


async def wait_pool(
    client: orchard.AsyncOrchard, template: str, count: int, limit_s: float
) -> float:
    started = time.perf_counter()
    while time.perf_counter() - started < limit_s:
        pools = await client.pools.list()
        pool = next(p for p in pools if p.template == template)
        if pool.ready >= count:
            return time.perf_counter() - started
        await asyncio.sleep(0.5)
    raise TimeoutError(f"pool {template} not at {count} ready after {limit_s} s")


async def run_load(
    n: int, client: orchard.AsyncOrchard, template: str, home: Path
) -> dict[str, Any]:
    gate = asyncio.Event()
    cpu = ServiceCpu(home)
    run = Run()
    tasks = [asyncio.ensure_future(one_user(run, client, template, gate)) for _ in range(n)]
    await asyncio.sleep(0)
    peak = PeakMemory()
    peak.start()
    run.started = time.perf_counter()
    gate.set()
    await asyncio.gather(*tasks)
    wall = time.perf_counter() - run.started
    peak_used = peak.stop()
    return {
        "n": n,
        "ok": run.ok,
        "success_rate": run.ok / n,
        "wall_s": round(wall, 3),
        "last_done_s": {k: round(v, 3) for k, v in sorted(run.finished.items())},
        "ops_ms": {k: percentiles(v) for k, v in sorted(run.ops.items())},
        "exec_per_s": round(len(run.ops.get("exec", [])) / wall, 1),
        "cpu_ms_per_sandbox": cpu.used(n),
        "peak_host_mem_used_mib": round(peak_used / MIB, 1),
        "errors": run.errors[:10],
        "error_count": len(run.errors),
    }


async def run_idle(
    n: int, client: orchard.AsyncOrchard, home: Path, settle: float
) -> dict[str, Any]:
    executor = pid_of_service(home, "orchard.executor")
    scheduler = pid_of_service(home, "orchard.scheduler")
    before = mem_available()
    slab_before = meminfo(("Slab", "SUnreclaim", "Shmem"))
    exec_before = pss_of(executor)
    sched_before = pss_of(scheduler)
    t0 = time.perf_counter()
    boxes = await asyncio.gather(
        *(client.sandboxes.create(network="none", timeout=300) for _ in range(n))
    )
    created_s = time.perf_counter() - t0
    # One exec each, so the executor holds its per-sandbox state as in use.
    await asyncio.gather(*(sb.exec("true") for sb in boxes))
    await asyncio.sleep(settle)
    ids = [sb.id for sb in boxes]
    pids = sandbox_pids(ids)
    sandbox_pss = sum(pss_of(p) for p in pids)
    after = mem_available()
    slab_after = meminfo(("Slab", "SUnreclaim", "Shmem"))
    exec_growth = pss_of(executor) - exec_before
    sched_growth = pss_of(scheduler) - sched_before
    out = {
        "n": n,
        "create_all_s": round(created_s, 2),
        "processes_per_sandbox": round(len(pids) / n, 2),
        "sandbox_pss_mib_per_sandbox": round(sandbox_pss / n / MIB, 3),
        "executor_growth_mib_per_sandbox": round(exec_growth / n / MIB, 3),
        "scheduler_growth_mib_per_sandbox": round(sched_growth / n / MIB, 3),
        "pss_total_mib_per_sandbox": round((sandbox_pss + exec_growth) / n / MIB, 3),
        "memavailable_drop_mib_per_sandbox": round((before - after) / n / MIB, 3),
        "slab_growth_mib_per_sandbox": round(
            (slab_after["Slab"] - slab_before["Slab"]) / n / MIB, 3
        ),
        "shmem_growth_mib_per_sandbox": round(
            (slab_after["Shmem"] - slab_before["Shmem"]) / n / MIB, 3
        ),
    }
    t0 = time.perf_counter()
    await asyncio.gather(*(sb.delete() for sb in boxes))
    out["delete_all_s"] = round(time.perf_counter() - t0, 2)
    return out


def leftovers(home: Path, ids_prefix: str = "") -> dict[str, int]:
    """What of this home is still on the host: overlay mounts, orchard cgroups, sandbox folders."""
    mountinfo = Path("/proc/self/mountinfo").read_text().splitlines()
    mounts = sum(1 for line in mountinfo if f" {home}/" in line)
    sandboxes = home / "sandboxes"
    folders = len(list(sandboxes.iterdir())) if sandboxes.is_dir() else 0
    cgroups_left = (
        len([p for p in MEMORY_CGROUP.iterdir() if p.is_dir()]) if MEMORY_CGROUP.is_dir() else 0
    )
    return {
        "overlay_mounts": mounts,
        "sandbox_dirs": folders,
        "memory_cgroups_all_homes": cgroups_left,
    }


@contextmanager
def stack_or_endpoint(args: argparse.Namespace, home: Path) -> Iterator[dict[str, str]]:
    if args.endpoint:
        yield {"endpoint": args.endpoint, "api_key": args.api_key}
        return
    with running_stack(home) as stack:
        yield {"endpoint": stack.endpoint, "api_key": (home / "dev-api-key").read_text().strip()}


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    home = Path(tempfile.mkdtemp(prefix="orch-scale-", dir="/tmp"))
    template = ""
    if args.mode == "warm":
        template = "scale"
        (home / "templates.toml").write_text(
            f'[templates.scale]\nnetwork = "none"\nmin = {args.n}\nmax = {args.n}\n'
        )
    result: dict[str, Any] = {"mode": args.mode, "cpus": os.cpu_count(), "home": str(home)}
    with stack_or_endpoint(args, home) as auth:
        # Warm the channels and the stack (first create pays imports and the image cache).
        client = orchard.AsyncOrchard(**auth)
        async with await client.sandboxes.create(network="none") as sb:
            await sb.exec("true")
        if args.mode == "warm":
            result["pool_fill_s"] = round(await wait_pool(client, template, args.n, 900), 2)
            await asyncio.sleep(2.0)
        if args.mode == "idle":
            result.update(await run_idle(args.n, client, home, args.settle))
        else:
            result.update(await run_load(args.n, client, template, home))
        await asyncio.sleep(args.drain)
        result["left_before_stop"] = leftovers(home)
    result["left_after_stop"] = leftovers(home)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--n", type=int, default=100)
    parser.add_argument("--mode", choices=("cold", "warm", "idle"), default="cold")
    parser.add_argument("--endpoint", default="")
    parser.add_argument("--api-key", default="")
    parser.add_argument("--settle", type=float, default=3.0, help="idle: seconds before measuring")
    parser.add_argument(
        "--drain", type=float, default=2.0, help="seconds to let background teardown finish"
    )
    args = parser.parse_args()
    print(json.dumps(asyncio.run(main_async(args))))


if __name__ == "__main__":
    main()
