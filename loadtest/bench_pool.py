"""Warm pool benchmark: claim from a warm pool vs cold create, through the SDK, in one run.

Starts a real ``orchard up`` (gateway, scheduler, node executor; runc
sandboxes) in a temporary home with one template whose pool holds ``--claims``
ready sandboxes, then measures through the public SDK, one call at a time:

- ``claim``: ``client.sandboxes.create(template=..., env=...)`` answered from the warm
  pool (the pool refills in the background meanwhile, as it would in use);
- ``cold_create``: ``client.sandboxes.create()`` with the same resources (the peer);
- ``hinted_batch``: seconds from ``client.pools.hint(T, N)`` to N ready members.

Prints one JSON object (latencies in ms; the target is claim p50 <= 5 ms).

    .venv/bin/python loadtest/bench_pool.py [--claims 100] [--creates 20] [--batch 20]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import orchard
from loadtest.peer_swerex import percentiles
from orchard import Sandbox
from tests.stack import running_stack

MEMORY = 256 << 20


def wait_ready(client: orchard.Orchard, template: str, count: int, timeout: float) -> float:
    started = time.perf_counter()
    deadline = started + timeout
    while time.perf_counter() < deadline:
        pool = next(p for p in client.pools.list() if p.template == template)
        if pool.ready >= count:
            return time.perf_counter() - started
        time.sleep(0.01)
    raise TimeoutError(f"pool {template} did not reach {count} ready in {timeout} s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--claims", type=int, default=100)
    parser.add_argument("--creates", type=int, default=20)
    parser.add_argument("--batch", type=int, default=20)
    args = parser.parse_args()
    home = Path(tempfile.mkdtemp(prefix="orch-bp-", dir="/tmp"))
    (home / "templates.toml").write_text(
        f"[templates.bench]\nmemory_bytes = {MEMORY}\nmin = {args.claims}\nmax = {args.claims}\n"
        f"[templates.batch]\nmemory_bytes = {MEMORY}\nmin = 0\nmax = {args.batch}\n"
    )
    result: dict[str, Any] = {
        "benchmark": "warm pool claim vs cold create (SDK -> gateway -> scheduler)",
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
    }
    with running_stack(home) as stack:
        client = orchard.Orchard(stack.endpoint, (home / "dev-api-key").read_text().strip())
        result["pool_fill_seconds"] = round(wait_ready(client, "bench", args.claims, 300), 3)
        time.sleep(1.0)  # let the fill's last deletes/creates settle
        client.sandboxes.list()  # warm the channel
        claimed: list[Sandbox] = []
        samples = []
        for i in range(args.claims):
            t0 = time.perf_counter()
            sb = client.sandboxes.create(template="bench", env={"TASK": str(i)})
            samples.append((time.perf_counter() - t0) * 1000)
            claimed.append(sb)
        pool = next(p for p in client.pools.list() if p.template == "bench")
        result["claim"] = {**percentiles(samples), "hits": pool.hits, "misses": pool.misses}
        assert claimed[0].exec("echo $TASK").stdout_text == "0\n"
        for sb in claimed:
            sb.delete()
        wait_ready(client, "bench", args.claims, 300)
        time.sleep(1.0)
        samples = []
        for _ in range(args.creates):
            t0 = time.perf_counter()
            sb = client.sandboxes.create(memory=MEMORY)
            samples.append((time.perf_counter() - t0) * 1000)
            sb.delete()
        result["cold_create"] = percentiles(samples)
        t0 = time.perf_counter()
        client.pools.hint("batch", args.batch, within=0)
        wait_ready(client, "batch", args.batch, 300)
        result["hinted_batch"] = {
            "sandboxes": args.batch,
            "seconds_to_warm": round(time.perf_counter() - t0, 3),
        }
    result["ratio_cold_over_claim_p50"] = round(
        result["cold_create"]["p50_ms"] / result["claim"]["p50_ms"], 1
    )
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
