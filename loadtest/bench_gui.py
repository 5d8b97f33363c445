"""The GUI recipe's browser environment: step latency and browsers per machine.

Starts a throwaway ``orchard up`` (real gateway, scheduler, node executor, runc sandboxes
from the browser image, ``make browser-image``), then:

- ``step``: in one browser sandbox, ``--n`` MiniWoB click-button steps (a click that does
  not end the episode, on the task's text) -> the next observation (screenshot PNG +
  elements + task state), through the SDK, for each transport (``port``: one keep-alive
  connection through ``connect_port``; ``exec``: one ``python3`` client per request);
  p50/p90/p99 ms;
- ``density``: ``--browsers`` sandboxes capped at ``--memory`` each, created and started
  at once; how many answered a reset and a step, how long that took, and each sandbox's
  memory (the cgroup's ``memory.current`` read inside, and the summed RSS of its Chromium
  processes from ``ps``).

Prints one JSON object. Bounded: ``--n`` steps, ``--browsers`` sandboxes.

    flock /tmp/orchard-heavy.lock .venv/bin/python -m loadtest.bench_gui [--n 100] [--browsers 6]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import time
from pathlib import Path
from typing import Any

from orchard.recipes.gui.actions import Click
from orchard.recipes.gui.browser import BrowserEnv, browser_sandbox_options
from orchard.recipes.gui.miniwob import MiniWoBTask

import orchard
from loadtest.bench_processes import summary
from tests.stack import running_stack


async def _steps(
    client: orchard.AsyncOrchard, transport: str, n: int, screenshot: Path | None = None
) -> dict[str, Any]:
    env = await BrowserEnv.create(client, transport=transport)  # type: ignore[arg-type]
    async with env:
        obs = await env.reset(MiniWoBTask("click-button", seed=0, episode_seconds=3600))
        if screenshot is not None:
            await asyncio.to_thread(screenshot.write_bytes, obs.png)
        query = obs.find(obs.utterance, tag="div")  # the instruction: clicking it ends nothing
        samples = []
        for _ in range(n):
            started = time.perf_counter()
            obs = await env.step(Click(*query.center))
            samples.append(time.perf_counter() - started)
            assert not obs.task_done and obs.png
        return summary(samples) | {"png_bytes": len(obs.png)}


_MEMORY_PROBE = (
    "cat /sys/fs/cgroup/memory.current 2>/dev/null || echo -1; "
    "ps -eo rss=,args= | awk '/chromium/ {s += $1} END {print s + 0}'"
)


async def _one_browser(client: orchard.AsyncOrchard, memory: str, seed: int) -> dict[str, Any]:
    started = time.perf_counter()
    try:
        env = await BrowserEnv.create(client, browser_sandbox_options(memory=memory))
    except orchard.OrchardError as err:
        return {"ok": False, "error": f"{type(err).__name__}: {err}"[:300]}
    try:
        obs = await env.reset(MiniWoBTask("click-button", seed=seed, episode_seconds=3600))
        await env.step(Click(*obs.find(obs.utterance, tag="div").center))
        ready = time.perf_counter() - started
        probe = await env.sandbox.exec(["sh", "-c", _MEMORY_PROBE], timeout=30)
        cgroup, rss_kib = (int(v) for v in probe.stdout_text.split())
        return {"ok": True, "seconds": ready, "cgroup_bytes": cgroup, "chromium_rss_kib": rss_kib}
    except orchard.OrchardError as err:
        return {"ok": False, "error": f"{type(err).__name__}: {err}"[:300]}
    finally:
        await env.close()


async def _density(client: orchard.AsyncOrchard, count: int, memory: str) -> dict[str, Any]:
    started = time.perf_counter()
    results = await asyncio.gather(*(_one_browser(client, memory, i) for i in range(count)))
    ok = [r for r in results if r["ok"]]
    mib = 1 << 20
    return {
        "browsers": count,
        "memory_cap": memory,
        "answered": len(ok),
        "wall_seconds": round(time.perf_counter() - started, 2),
        "ready_seconds_max": round(max((r["seconds"] for r in ok), default=0.0), 2),
        "cgroup_mib": sorted(round(r["cgroup_bytes"] / mib) for r in ok if r["cgroup_bytes"] >= 0),
        "chromium_rss_mib": sorted(round(r["chromium_rss_kib"] / 1024) for r in ok),
        "errors": [r["error"] for r in results if not r["ok"]][:5],
    }


async def _run(
    endpoint: str, key: str, n: int, browsers: int, memory: str, screenshot: Path | None
) -> dict[str, Any]:
    async with orchard.AsyncOrchard(endpoint, key) as client:
        return {
            "step_port": await _steps(client, "port", n, screenshot),
            "step_exec": await _steps(client, "exec", max(10, n // 4)),
            "density": await _density(client, browsers, memory),
        }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--n", type=int, default=100)
    parser.add_argument("--browsers", type=int, default=6)
    parser.add_argument("--memory", default="512Mi")
    parser.add_argument("--screenshot", type=Path, default=None, help="save the first PNG here")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp, running_stack(Path(tmp) / "home") as stack:
        key = (stack.home / "dev-api-key").read_text().strip()
        result = asyncio.run(
            _run(stack.endpoint, key, args.n, args.browsers, args.memory, args.screenshot)
        )
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
