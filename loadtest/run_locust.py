"""Drive one headless Locust run of the 1000-sandbox scenario against a fresh stack; JSON out.

1. Starts ``orchard up`` in a temporary home (its own processes; Locust never
   hosts the stack). Quotas are written sized for the run (``max_sandboxes`` =
   users + room for the probe); each sandbox gets the server's default limits
   (1 core, 1 GiB, 512 pids: limits, not reservations).
2. ``warm``: a template ``locust`` (default image, policy ``none``) whose pool is
   held at N; waits until N are ready, then measures what N idle sandboxes cost
   (``density.idle_cost``: PSS, MemAvailable drop, kernel deltas).
3. Runs ``locust -f loadtest/locustfile.py --headless -u N -r N`` with ``--csv``
   and ``--html`` into ``--out``, while a thread samples host memory every 100 ms
   and a liveness probe (``locust_probe``) creates + execs every 2 s.
4. Accounts the CPU of the window (``locust_cpu``: Locust vs the stack vs the rest).
5. ``cold``: creates N sandboxes, lets them idle and measures their cost
   (``--no-idle`` skips it); ``warm``: the pool members were measured in step 2.
6. Counts what is left (``locust_leaks``) after the load and after the stack stops.

Writes ``<out>/summary.json`` and prints it.

    flock /tmp/orchard-heavy.lock .venv/bin/python loadtest/run_locust.py --users 1000 --mode cold
    (or: make loadtest N=1000 MODE=cold)
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import orchard  # noqa: E402
from loadtest.density import MemorySnapshot, PeakMemory, idle_cost  # noqa: E402
from loadtest.locust_cpu import CpuSnapshot, cpu_breakdown  # noqa: E402
from loadtest.locust_leaks import ids_in_state, leftovers, nothing_left  # noqa: E402
from loadtest.locust_probe import LivenessProbe  # noqa: E402
from loadtest.locust_summary import load_summary  # noqa: E402
from tests.stack import running_stack  # noqa: E402

TEMPLATE = "locust"
LOCUSTFILE = ROOT / "loadtest" / "locustfile.py"
TARGET_WALL_SECONDS = {"cold": 26.0, "warm": 10.0}
TARGET_PSS_MIB = 8.0
PROBE_QUOTA_ROOM = 64
PROBE_TENANT = "liveness-probe"
IDLE_CREATE_THREADS = 32


def locust_binary() -> str:
    beside = Path(sys.executable).with_name("locust")
    return str(beside) if beside.exists() else (shutil.which("locust") or "locust")


def write_config(home: Path, users: int, mode: str) -> None:
    quotas = {"default": {"max_sandboxes": users + PROBE_QUOTA_ROOM}}
    (home / "quotas.json").write_text(json.dumps(quotas))
    if mode == "warm":
        (home / "templates.toml").write_text(
            f'[templates.{TEMPLATE}]\nnetwork = "none"\nmin = {users}\nmax = {users}\n'
        )


def wait_pool_ready(client: orchard.Orchard, count: int, timeout: float) -> float:
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        pool = next(p for p in client.pools.list() if p.template == TEMPLATE)
        if pool.ready >= count:
            return time.monotonic() - started
        time.sleep(0.5)
    raise TimeoutError(f"pool {TEMPLATE} did not reach {count} ready in {timeout:.0f} s")


def measure_idle(client: orchard.Orchard, home: Path, count: int, settle: float) -> dict[str, Any]:
    """Create ``count`` sandboxes (each runs one ``true``, so the executor holds its state for
    it), let them sit idle, measure what they cost against a snapshot taken just before,
    then delete them."""
    before = MemorySnapshot.take(home)
    started = time.monotonic()
    with ThreadPoolExecutor(IDLE_CREATE_THREADS) as pool:
        sandboxes = list(pool.map(lambda _: client.sandboxes.create(network="none"), range(count)))
        created_s = time.monotonic() - started
        list(pool.map(lambda sb: sb.exec("true"), sandboxes))
        time.sleep(settle)
        cost = idle_cost(before, [sb.id for sb in sandboxes], home)
        started = time.monotonic()
        list(pool.map(lambda sb: sb.delete(), sandboxes))
    cost["baseline"] = "the stack up and idle, just before the sandboxes were created"
    cost["create_all_s"] = round(created_s, 1)
    cost["delete_all_s"] = round(time.monotonic() - started, 1)
    return cost


def run_locust(
    auth: dict[str, str], users: int, mode: str, out: Path, run_time: int, processes: int
) -> tuple[int, float]:
    phases = out / "phases"
    phases.mkdir(parents=True, exist_ok=True)
    for stale in phases.glob("phases-*.json"):
        stale.unlink()
    command = [
        locust_binary(),
        "-f",
        str(LOCUSTFILE),
        "--headless",
        "-u",
        str(users),
        "-r",
        str(users),
        "--run-time",
        f"{run_time}s",
        "--csv",
        str(out / "locust"),
        "--html",
        str(out / "locust.html"),
        "--only-summary",
        "--loglevel",
        "WARNING",
    ]
    if processes > 1:
        command += ["--processes", str(processes)]
    env = {
        **os.environ,
        "ORCHARD_ENDPOINT": auth["endpoint"],
        "ORCHARD_API_KEY": auth["api_key"],
        "ORCHARD_LOCUST_TEMPLATE": TEMPLATE if mode == "warm" else "",
        "ORCHARD_LOCUST_PHASES": str(phases),
    }
    started = time.monotonic()
    with (out / "locust.log").open("wb") as log:
        code = subprocess.run(
            command, env=env, stdout=log, stderr=subprocess.STDOUT, timeout=run_time + 120
        ).returncode
    return code, time.monotonic() - started


def run(
    users: int,
    mode: str,
    out: Path,
    run_time: int = 300,
    processes: int = 1,
    probe_interval: float = 2.0,
    drain: float = 3.0,
    idle: bool = True,
) -> dict[str, Any]:
    out.mkdir(parents=True, exist_ok=True)
    home = Path(tempfile.mkdtemp(prefix="orch-locust-", dir="/tmp"))
    write_config(home, users, mode)
    result: dict[str, Any] = {
        "benchmark": "Locust: per user create -> 4 commands -> delete, all users at once",
        "mode": mode,
        "users": users,
        "locust_processes": processes,
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "mem_total_mib": round(MemorySnapshot.take(home).info["MemTotal"] / (1 << 20)),
        },
        "home": str(home),
        "out": str(out),
    }
    before_stack = MemorySnapshot.take(home)
    with running_stack(home) as stack:
        auth = {"endpoint": stack.endpoint, "api_key": (home / "dev-api-key").read_text().strip()}
        client = orchard.Orchard(**auth)
        # First create pays imports and the image cache: not part of the run.
        with client.sandboxes.create(network="none") as sandbox:
            sandbox.exec("true")
        if mode == "warm":
            result["pool_fill_s"] = round(wait_pool_ready(client, users, 1800), 1)
            time.sleep(3.0)  # let the filler's last creates settle
            result["idle_memory"] = idle_cost(before_stack, ids_in_state(home, "ready"), home)
            result["idle_memory"]["baseline"] = (
                "before the stack started: the MemAvailable drop includes the stack's own "
                "services; the PSS figures do not depend on the baseline"
            )
        peak = PeakMemory()
        # The probe is another client: its own tenant, so it stands in the gateway's fair
        # admission as a second tenant would, not at the back of the load's own queue.
        probe_key = stack.cli("tenant", "create", PROBE_TENANT, check=True).stdout.strip()
        probe = LivenessProbe(auth["endpoint"], probe_key, probe_interval)
        peak.start()
        probe.start()
        cpu_before = CpuSnapshot.take(home)
        code, locust_s = run_locust(auth, users, mode, out, run_time, processes)
        cpu_after = CpuSnapshot.take(home)
        result["liveness_probe"] = probe.stop()
        result["host_memory"] = peak.stop()
        result["locust_exit_code"] = code
        result["locust_process_s"] = round(locust_s, 2)
        result.update(load_summary(out / "locust", out / "phases", users))
        result["cpu"] = cpu_breakdown(cpu_before, cpu_after, locust_s)
        time.sleep(drain)
        result["left_after_load"] = leftovers(home)
        if mode == "warm":
            result["left_after_load"]["note"] = (
                f"the pool refills to {users} after the claims: those ready members are expected"
            )
        elif idle:
            result["idle_memory"] = measure_idle(client, home, users, settle=3.0)
    result["left_after_stop"] = leftovers(home)
    result["nothing_left_after_stop"] = nothing_left(result["left_after_stop"])
    per = result.get("idle_memory", {}).get("per_sandbox", {})
    result["targets"] = {
        "success_rate_1": result["success_rate"] == 1.0,
        "wall_s_max": TARGET_WALL_SECONDS[mode],
        "wall_met": bool(result["wall_s"]) and result["wall_s"] <= TARGET_WALL_SECONDS[mode],
        "idle_pss_mib_max": TARGET_PSS_MIB,
        "idle_pss_met": (per["pss_mib"] <= TARGET_PSS_MIB) if per else None,
        "probe_all_under_1s": result["liveness_probe"]["over_target"] == 0
        and result["liveness_probe"]["failed"] == 0,
    }
    (out / "summary.json").write_text(json.dumps(result, indent=2))
    # The services' logs (per-create timings, the probe tenant's calls) outlive the home.
    shutil.copytree(home / "logs", out / "logs", dirs_exist_ok=True)
    if result["nothing_left_after_stop"]:  # never walk into a mount that was left behind
        shutil.rmtree(home, ignore_errors=True)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--users", type=int, default=1000)
    parser.add_argument("--mode", choices=("cold", "warm"), default="cold")
    parser.add_argument("--out", type=Path, default=None, help="default build/loadtest/MODE-N")
    parser.add_argument("--run-time", type=int, default=300, help="Locust's --run-time bound (s)")
    parser.add_argument("--processes", type=int, default=1, help="Locust --processes (1: one)")
    parser.add_argument("--probe-interval", type=float, default=2.0)
    parser.add_argument(
        "--no-idle",
        action="store_true",
        help="cold: skip measuring N idle sandboxes after the load",
    )
    args = parser.parse_args()
    out = args.out or ROOT / "build" / "loadtest" / f"{args.mode}-{args.users}"
    result = run(
        args.users,
        args.mode,
        out,
        args.run_time,
        args.processes,
        args.probe_interval,
        idle=not args.no_idle,
    )
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
