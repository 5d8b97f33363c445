"""The headline benchmark: Orchard through its SDK, side by side with peers, in one run.

Starts a real ``orchard up`` (gateway, scheduler, node executor; sandboxes are
runc containers) in a temporary home, then measures, through the public SDK:

- ``exec``: N sequential ``sb.exec(["true"])`` round trips (after warm-up);
- ``session``: N sequential ``session.run("true")`` in one persistent shell;
- ``throughput``: exec/s with 64 concurrent streams (AsyncSandbox) into one sandbox;
- ``create``: cold create of a sandbox (create returns READY), p50/p90, one at a time;

and in the same run the peers from targets.md that can run here: the physical
floor (``subprocess.run(["/bin/true"])``), SWE-ReX (``swerex-remote``
``execute`` and a bash session) and ``docker exec ID true`` against a private
dockerd (``loadtest/peer_docker.py``; reported as skipped, with the reason,
when dockerd cannot start). Prints one JSON object.

    .venv/bin/python loadtest/bench.py [--n 1000] [--creates 30] [--seconds 5] [--docker-n 100]
"""

from __future__ import annotations

import argparse
import asyncio
import json
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

from loadtest.peer_docker import measure_docker
from loadtest.peer_swerex import measure_swerex, percentiles
from orchard import AsyncSandbox, Sandbox
from tests.stack import running_stack


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
    endpoint: str, key: str, sandbox_id: str, concurrency: int, seconds: float
) -> dict[str, Any]:
    async def run() -> dict[str, Any]:
        sb = await AsyncSandbox.connect(sandbox_id, endpoint=endpoint, api_key=key)
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


def measure_orchard(
    endpoint: str, key: str, n: int, creates: int, seconds: float
) -> dict[str, Any]:
    out: dict[str, Any] = {}
    create_ms = []
    for _ in range(creates):
        t0 = time.perf_counter()
        sb = Sandbox.create(endpoint=endpoint, api_key=key)
        create_ms.append((time.perf_counter() - t0) * 1000)
        sb.delete()
    out["create"] = percentiles(create_ms)
    with Sandbox.create(endpoint=endpoint, api_key=key) as sb:
        out["exec"] = timed(n, 100, lambda: sb.exec(["true"]))
        with sb.session() as sh:
            out["session"] = timed(n, 50, lambda: sh.run("true"))
        out["throughput"] = throughput(endpoint, key, sb.id, 64, seconds)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--n", type=int, default=1000)
    parser.add_argument("--creates", type=int, default=30)
    parser.add_argument("--seconds", type=float, default=5.0)
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
        "floor_subprocess_true": floor(args.n),
    }
    with (
        tempfile.TemporaryDirectory(prefix="orchard-bench-") as tmp,
        running_stack(Path(tmp) / "home") as stack,
    ):
        key = (stack.home / "dev-api-key").read_text().strip()
        result["orchard"] = measure_orchard(stack.endpoint, key, args.n, args.creates, args.seconds)
    if not args.skip_peers:
        result["swerex"] = measure_swerex(args.n, min(args.n, 100))
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
            result["docker"] = measure_docker(args.docker_n)
            if "exec" in result["docker"]:
                result.setdefault("ratios", {})["exec_p50_docker_over_orchard"] = round(
                    result["docker"]["exec"]["p50_ms"] / result["orchard"]["exec"]["p50_ms"], 1
                )
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
