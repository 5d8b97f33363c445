"""The headline benchmark: Orchard through its SDK, side by side with peers, in one run.

Starts a real ``orchard up`` (gateway, scheduler, node executor; sandboxes are
runc containers) in a temporary home, then measures, through the public SDK:

- ``exec``: N sequential ``sb.exec(["true"])`` round trips (after warm-up);
- ``session``: N sequential ``session.run("true")`` in one persistent shell;
- ``throughput``: exec/s with 64 concurrent streams (AsyncSandbox) into one sandbox, from
  one client process and (``throughput_2proc``) from 2 processes of 32 streams each, summed
  (so the bench client's own CPU is not the limit);
- ``create``: cold create of a sandbox (create returns READY), p50/p90, one at a time;
- ``warm_claim``: ``client.sandboxes.create(template=...)`` answered from a warm pool (as
  ``loadtest/bench_pool.py``), beside the cold creates of the same run;
- ``proxy``: exec ``true`` direct vs through the gateway's data-plane proxy, alternating
  rounds (``loadtest/bench_proxy.py``); overhead = paired p50 difference; the stack runs
  with ``--data-plane-proxy nginx``, so the same rotation also goes through nginx
  (``nginx_overhead_p50_ms``);
- ``files``: a ``--file-mib`` file each way and a ``--files``-file tree each way through
  the SDK (``loadtest/bench_files.py``'s ``sdk_figures``);

and in the same run the peers from targets.md that can run here: the physical
floor (``subprocess.run(["/bin/true"])``), SWE-ReX (``swerex-remote``
``execute`` and a bash session) and ``docker exec ID true`` against a private
dockerd (``loadtest/peer_docker.py``; reported as skipped, with the reason,
when dockerd cannot start). Prints one JSON object.

    .venv/bin/python loadtest/bench.py [--n 1000] [--creates 30] [--seconds 5] [--docker-n 100]
        [--claims 50] [--proxy-rounds 10] [--file-mib 256] [--files 10000]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import platform
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from loadtest.bench_files import sdk_figures
from loadtest.bench_pool import wait_ready
from loadtest.bench_proxy import proxy_overhead
from loadtest.peer_docker import measure_docker
from loadtest.peer_swerex import measure_swerex, percentiles
from orchard import AsyncOrchard, Orchard
from tests.stack import running_stack

POOL_TEMPLATE = "bench"
POOL_MEMORY = 256 << 20


def timed(n: int, warmup: int, call: Callable[[], object]) -> dict[str, float]:
    for _ in range(warmup):
        call()
    samples = []
    for _ in range(n):
        t0 = time.perf_counter()
        call()
        samples.append((time.perf_counter() - t0) * 1000)
    return percentiles(samples)


def floor(n: int) -> dict[str, float]:
    return timed(n, 20, lambda: subprocess.run(["/bin/true"], check=True))


def throughput(
    endpoint: str,
    key: str,
    sandbox_id: str,
    concurrency: int,
    seconds: float,
    start_at: float | None = None,
) -> dict[str, Any]:
    """Exec/s of ``concurrency`` streams for ``seconds`` (from wall time ``start_at`` if given)."""

    async def run() -> dict[str, Any]:
        sb = await AsyncOrchard(endpoint, key).sandboxes.connect(sandbox_id)
        await sb.exec(["true"])  # connect and warm before the clock
        if start_at is not None:
            await asyncio.sleep(max(0.0, start_at - time.time()))
        done = failures = 0
        deadline = time.perf_counter() + seconds

        async def worker() -> None:
            nonlocal done, failures
            while time.perf_counter() < deadline:
                r = await sb.exec(["true"])
                if r.exit_code == 0:
                    done += 1
                else:
                    failures += 1

        t0 = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        elapsed = time.perf_counter() - t0
        return {
            "concurrency": concurrency,
            "exec_per_s": round(done / elapsed, 1),
            "failures": failures,
        }

    return asyncio.run(run())


def _throughput_worker(args: tuple[str, str, str, int, float, float]) -> dict[str, Any]:
    return throughput(*args)


def throughput_processes(
    endpoint: str, key: str, sandbox_id: str, concurrency: int, seconds: float, processes: int
) -> dict[str, Any]:
    """``concurrency`` streams split over ``processes`` client processes started together, summed."""
    start_at = time.time() + 3.0  # after every process has imported, connected and warmed
    share = concurrency // processes
    jobs = [(endpoint, key, sandbox_id, share, seconds, start_at)] * processes
    with multiprocessing.get_context("spawn").Pool(processes) as pool:
        parts = pool.map(_throughput_worker, jobs)
    return {
        "concurrency": share * processes,
        "processes": processes,
        "exec_per_s": round(sum(p["exec_per_s"] for p in parts), 1),
        "per_process": [p["exec_per_s"] for p in parts],
        "failures": sum(p["failures"] for p in parts),
    }


def warm_claims(endpoint: str, key: str, claims: int) -> dict[str, Any]:
    """``claims`` sequential claims from the ``bench`` template's warm pool (filled first)."""
    client = Orchard(endpoint, key)
    samples, claimed = [], []
    for i in range(claims):
        t0 = time.perf_counter()
        claimed.append(client.sandboxes.create(template=POOL_TEMPLATE, env={"TASK": str(i)}))
        samples.append((time.perf_counter() - t0) * 1000)
    for sb in claimed:
        sb.delete()
    return percentiles(samples)


def measure_orchard(endpoint: str, key: str, args: argparse.Namespace) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if args.claims > 0:
        # The pool fills as the stack starts; wait, so its creates do not run beside
        # the figures below.
        out["pool_fill_seconds"] = round(
            wait_ready(Orchard(endpoint, key), POOL_TEMPLATE, args.claims, 300), 3
        )
        time.sleep(1.0)
    create_ms = []
    for _ in range(args.creates):
        t0 = time.perf_counter()
        sb = Orchard(endpoint, key).sandboxes.create()
        create_ms.append((time.perf_counter() - t0) * 1000)
        sb.delete()
    out["create"] = percentiles(create_ms)
    with Orchard(endpoint, key).sandboxes.create() as sb:
        out["exec"] = timed(args.n, 100, lambda: sb.exec(["true"]))
        with sb.session() as sh:
            out["session"] = timed(args.n, 50, lambda: sh.run("true"))
        out["throughput"] = throughput(endpoint, key, sb.id, 64, args.seconds)
        out["throughput_2proc"] = throughput_processes(endpoint, key, sb.id, 64, args.seconds, 2)
        if args.proxy_rounds > 0:
            out["proxy"] = proxy_overhead(
                endpoint, key, sb.id, args.proxy_rounds, 200, args.data_plane_endpoint
            )
        if args.files > 0:
            out["files"] = sdk_figures(sb, args.file_mib, args.files, repeat=args.files_repeat)
    if args.claims > 0:
        out["warm_claim"] = warm_claims(endpoint, key, args.claims)
    return out


def file_ratios(result: dict[str, Any]) -> None:
    """Orchard's file figures over each peer's, where the peer has the same operation."""
    files = result.get("orchard", {}).get("files")
    if not files:
        return
    ours = {
        "upload_MBps": files["write_MBps"]["median"],
        "download_MBps": files["read_MBps"]["median"],
        "upload_files_per_s": files["upload_files_per_s"]["median"],
        "download_files_per_s": files["download_files_per_s"]["median"],
    }
    peers = {
        "swerex": result.get("swerex", {}).get("files"),
        "docker": result.get("docker", {}).get("cp"),
    }
    ratios = result.setdefault("ratios", {})
    for peer, theirs in peers.items():
        for key, value in (theirs or {}).items():
            if key in ours and isinstance(value, (int, float)) and value > 0:
                ratios[f"{key}_orchard_over_{peer}"] = round(ours[key] / value, 1)


def targets(result: dict[str, Any]) -> dict[str, Any]:
    """Each figure of issue 5 beside its target, and whether this run met it."""
    orch = result.get("orchard", {})
    checks: dict[str, tuple[Any, str, float]] = {}

    def add(name: str, path: tuple[str, ...], op: str, target: float) -> None:
        value: Any = orch
        for key in path:
            if not isinstance(value, dict) or key not in value:
                return
            value = value[key]
        checks[name] = (value, op, target)

    add("exec_p50_ms", ("exec", "p50_ms"), "<=", 1.5)
    add("exec_p99_ms", ("exec", "p99_ms"), "<=", 10.0)
    add("session_p50_ms", ("session", "p50_ms"), "<=", 3.0)
    add("exec_per_s_64_streams", ("throughput", "exec_per_s"), ">=", 1500)
    add("exec_per_s_64_streams_2proc", ("throughput_2proc", "exec_per_s"), ">=", 1500)
    add("cold_create_p50_ms", ("create", "p50_ms"), "<=", 150)
    add("warm_claim_p50_ms", ("warm_claim", "p50_ms"), "<=", 5)
    add("proxy_overhead_p50_ms", ("proxy", "overhead_p50_ms"), "<=", 0.3)
    add("proxy_overhead_p50_ms_nginx", ("proxy", "nginx_overhead_p50_ms"), "<=", 0.3)
    add("file_write_MBps", ("files", "write_MBps", "median"), ">=", 300)
    add("file_read_MBps", ("files", "read_MBps", "median"), ">=", 300)
    add("tree_upload_files_per_s", ("files", "upload_files_per_s", "median"), ">=", 20_000)
    add("tree_download_files_per_s", ("files", "download_files_per_s", "median"), ">=", 20_000)
    return {
        name: {
            "value": value,
            "target": f"{op} {target}",
            "met": value <= target if op == "<=" else value >= target,
        }
        for name, (value, op, target) in checks.items()
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--n", type=int, default=1000)
    parser.add_argument("--creates", type=int, default=30)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--claims", type=int, default=50, help="warm claims (0: skip)")
    parser.add_argument("--proxy-rounds", type=int, default=10, help="A/B rounds (0: skip)")
    parser.add_argument("--file-mib", type=int, default=256)
    parser.add_argument("--files", type=int, default=10_000, help="tree size (0: skip files)")
    parser.add_argument("--files-repeat", type=int, default=3)
    parser.add_argument(
        "--no-peer-files", dest="peer_files", action="store_false", help="peers: exec only"
    )
    parser.add_argument("--skip-peers", action="store_true")
    parser.add_argument(
        "--docker-n", type=int, default=100, help="docker exec samples (0: skip docker)"
    )
    args = parser.parse_args()

    result: dict[str, Any] = {
        "machine": {
            "cpus": os.cpu_count(),
            "kernel": platform.release(),
            "python": platform.python_version(),
        },
        "loadavg_before": round(os.getloadavg()[0], 2),
        "floor_subprocess_true": floor(args.n),
    }
    with tempfile.TemporaryDirectory(prefix="orchard-bench-") as tmp:
        home = Path(tmp) / "home"
        home.mkdir()
        if args.claims > 0:
            (home / "templates.toml").write_text(
                f"[templates.{POOL_TEMPLATE}]\nmemory_bytes = {POOL_MEMORY}\n"
                f"min = {args.claims}\nmax = {args.claims}\n"
            )
        os.environ["ORCHARD_DATA_PLANE_PROXY"] = "nginx"  # the gateway's proxy is served too
        with running_stack(home) as stack:
            key = (stack.home / "dev-api-key").read_text().strip()
            args.data_plane_endpoint = (home / "run" / "data-plane.addr").read_text().strip()
            result["orchard"] = measure_orchard(stack.endpoint, key, args)
    result["loadavg_after"] = round(os.getloadavg()[0], 2)
    if not args.skip_peers:
        result["swerex"] = measure_swerex(
            args.n, min(args.n, 100), args.file_mib, args.files if args.peer_files else 0
        )
        sw = result["swerex"]
        if "execute" in sw:
            orch = result["orchard"]
            result["ratios"] = {
                "exec_p50_swerex_over_orchard": round(
                    sw["execute"]["p50_ms"] / orch["exec"]["p50_ms"], 2
                ),
                "session_p50_swerex_over_orchard": round(
                    sw["session"]["p50_ms"] / orch["session"]["p50_ms"], 1
                ),
            }
        if args.docker_n > 0:
            result["docker"] = measure_docker(
                args.docker_n, file_mib=args.file_mib, files=args.files if args.peer_files else 0
            )
            if "exec" in result["docker"]:
                result.setdefault("ratios", {})["exec_p50_docker_over_orchard"] = round(
                    result["docker"]["exec"]["p50_ms"] / result["orchard"]["exec"]["p50_ms"], 1
                )
        file_ratios(result)
    result["targets"] = targets(result)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
