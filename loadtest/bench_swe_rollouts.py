"""Hundreds of concurrent SWE rollouts from one process: the built-in bash agent's throughput
and its own overhead per step.

Starts a real ``orchard up`` (runc sandboxes, the recording model proxy) whose model upstream
is the scripted server (``orchard.testing.scripted_model``) in its own process, answering at
once with a fixed 4-step policy (read the file, grep it, fix it with sed, submit). The driver
runs ``--n`` rollouts of a small repository task at once through ``orchard.rollouts.run_rollouts``
(one sandbox each: create, files, ``git init`` setup, the agent, diff, delete; the session
finished and its samples read) and prints JSON:

- ``steps_per_s``: model steps of all rollouts / the wall time of the whole batch;
- ``loop_overhead_ms``: per step, the step's wall time minus the time awaiting the model call
  and the command(s) (what the loop itself costs: history encoding, answer parsing,
  truncation, bookkeeping), p50 / p90 / p99 over every step;
- ``model_ms`` / ``exec_ms`` per step, the runner's phases p50, statuses, and what is left
  over (sandboxes listed by the API, overlay mounts, sandbox folders) after the batch.

A baseline of ``--baseline`` rollouts one at a time comes first (the overhead without 255
neighbours on the event loop). ``--pool``: the stack also has a template of the task's image
with a warm pool of ``--n`` sandboxes; once it is full, a second batch claims from it
(``SandboxOptions(template=...)``): whether a pool pays.

    flock /tmp/orchard-heavy.lock .venv/bin/python -m loadtest.bench_swe_rollouts [--n 256]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from orchard.recipes.swe.agent import BashAgent

import orchard
from loadtest.scale_driver import leftovers, wait_pool
from orchard.rollouts import (
    Limits,
    ModelProxyClient,
    RolloutResult,
    SandboxOptions,
    Task,
    run_rollouts,
)
from tests.stack import running_stack

CODE = "def mean(values):\n    return sum(values) / (len(values) + 1)\n"
STEPS = [
    "cat calc/__init__.py",
    "grep -n 'len(values)' calc/__init__.py",
    "sed -i 's|(len(values) + 1)|len(values)|' calc/__init__.py",
    "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT",
]


def policy(body: dict[str, Any]) -> dict[str, Any]:
    i = sum(1 for m in body["messages"] if m.get("role") == "assistant")
    command = STEPS[min(i, len(STEPS) - 1)]
    return {"tool_calls": [{"id": f"c{i}", "name": "bash",
                            "arguments": json.dumps({"command": command})}]}  # fmt: skip


def serve(url_file: str) -> None:
    """The scripted upstream, in its own process (the driver's event loop stays its own)."""
    from orchard.testing.scripted_model import scripted_upstream

    with scripted_upstream(policy) as (_upstream, url):
        Path(url_file).write_text(url)
        while True:
            time.sleep(3600)


def pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def ms(values: list[float]) -> dict[str, float | None]:
    def r(v: float | None) -> float | None:
        return None if v is None else round(v * 1000, 3)

    return {"p50": r(pct(values, 0.5)), "p90": r(pct(values, 0.9)), "p99": r(pct(values, 0.99))}


def summarise(results: list[RolloutResult], wall: float) -> dict[str, Any]:
    overhead: list[float] = []
    model: list[float] = []
    exec_: list[float] = []
    phases: dict[str, list[float]] = {}
    for r in results:
        timing = (r.detail.get("harness") or {}).get("timing") or {}
        overhead += timing.get("overhead_s", [])
        model += timing.get("model_s", [])
        exec_ += timing.get("exec_s", [])
        for name, seconds in (r.detail.get("phases") or {}).items():
            phases.setdefault(name, []).append(seconds)
    steps = sum(r.steps for r in results)
    return {
        "rollouts": len(results), "steps": steps, "wall_s": round(wall, 3),
        "steps_per_s": round(steps / wall, 1), "rollouts_per_s": round(len(results) / wall, 2),
        "loop_overhead_ms": ms(overhead), "model_ms": ms(model), "exec_ms": ms(exec_),
        "phases_p50_ms": {k: round(statistics.median(v) * 1000, 1) for k, v in phases.items()},
        "statuses": {s: sum(1 for r in results if str(r.status) == s)
                     for s in ("completed", "truncated", "aborted")},
        "faults": sorted({str(r.fault) for r in results if r.fault})[:5],
        "fixed": sum(1 for r in results if "len(values)" in r.diff),
        "samples": sum(len(r.samples) for r in results),
    }  # fmt: skip


async def batch(
    client: orchard.AsyncOrchard,
    proxy: ModelProxyClient,
    n: int,
    concurrency: int,
    template: str | None = None,
) -> dict[str, Any]:
    task = Task(
        id="bench-calc", prompt="mean divides by one more than the number of values",
        image="debian:bookworm", workdir="/testbed",
        files={"/testbed/calc/__init__.py": CODE.encode()},
        setup=("git init -q && git add -A && git -c user.name=b -c user.email=b@b commit -qm base",),
    )  # fmt: skip
    async with BashAgent() as agent:
        t0 = time.monotonic()
        results = await run_rollouts(
            client, agent, [task] * n, proxy=proxy, model="scripted", concurrency=concurrency,
            limits=Limits(max_steps=10, max_seconds=600),
            sandbox=SandboxOptions(template=template),
        )  # fmt: skip
        wall = time.monotonic() - t0
    return summarise(results, wall)


async def measure(
    args: argparse.Namespace, endpoint: str, key: str, proxy_url: str
) -> dict[str, Any]:
    out: dict[str, Any] = {}
    async with (
        orchard.AsyncOrchard(endpoint, key) as client,
        ModelProxyClient(proxy_url, key) as proxy,
    ):
        if args.pool:  # full before anything is measured: its fill is not in a batch's time
            out["pool_fill_s"] = round(await wait_pool(client, "swe-bench", args.n, 900), 2)
        await batch(client, proxy, 2, 2)  # warm: imports, image cache, channels
        out["baseline_one_at_a_time"] = await batch(client, proxy, args.baseline, 1)
        out["concurrent"] = await batch(client, proxy, args.n, args.n)
        if args.pool:
            await asyncio.sleep(2.0)
            out["concurrent_warm_pool"] = await batch(client, proxy, args.n, args.n, "swe-bench")
        await asyncio.sleep(2.0)
        out["left_sandboxes_api"] = len(await client.sandboxes.list())
    return out


def run(args: argparse.Namespace, home: Path) -> dict[str, Any]:
    url_file = home / "upstream.url"
    server = subprocess.Popen([sys.executable, "-m", "loadtest.bench_swe_rollouts",
                               "--serve", str(url_file)])  # fmt: skip
    try:
        deadline = time.monotonic() + 30
        while not url_file.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        url = url_file.read_text()
        out: dict[str, Any] = {"n": args.n, "cpus": os.cpu_count()}
        if args.pool:  # a pool the size of the batch, filled before its clock starts
            (home / "templates.toml").write_text(
                f'[templates.swe-bench]\nimage = "debian:bookworm"\nnetwork = "none"\n'
                f"min = {args.n}\nmax = {args.n}\n"
            )
        with running_stack(home, up_args=["--model-upstream", url]) as stack:
            key = (home / "dev-api-key").read_text().strip()
            proxy_url = (home / "run" / "modelproxy.addr").read_text().strip()
            out.update(asyncio.run(measure(args, stack.endpoint, key, proxy_url)))
            out["left_on_host"] = leftovers(home)  # a pool's members are still there
        out["left_after_stop"] = leftovers(home)
        return out
    finally:
        server.terminate()
        server.wait(10)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--n", type=int, default=256)
    parser.add_argument("--baseline", type=int, default=8)
    parser.add_argument("--pool", action="store_true", help="also a batch claimed from a warm pool")
    parser.add_argument("--serve", default="", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        serve(args.serve)
        return
    home = Path(tempfile.mkdtemp(prefix="orch-swe-bench-", dir="/tmp"))
    print(json.dumps(run(args, home), indent=2))


if __name__ == "__main__":
    main()
