"""The GUI recipe's browser environment: step latency and browsers per machine.

Starts a throwaway ``orchard up`` (real gateway, scheduler, node executor, runc sandboxes
from the browser image, ``make browser-image``), then:

- ``step``: in one browser sandbox, ``--n`` MiniWoB click-button steps (a click that does
  not end the episode, on the task's text) -> the next observation (screenshot PNG +
  elements + task state), through the SDK, for each transport (``port``: one keep-alive
  connection through ``connect_port``; ``exec``: one ``python3`` client per request);
  p50/p90/p99 ms;
- ``density``: ``--browsers`` sandboxes capped at ``--memory`` each, created and started
  at once; how many answered a reset and a step, how long that took, and what each browser
  costs: its sandbox's memory cgroup read **on the host** after the reset and step (the
  sandbox cannot read it: its ``/sys/fs/cgroup`` is empty inside), i.e. the kernel's charge
  now and its peak since the sandbox was made (cgroup v1 ``memory.usage_in_bytes`` /
  ``memory.max_usage_in_bytes``, v2 ``memory.current`` / ``memory.peak``) and the anonymous
  part of it (``memory.stat`` ``total_rss`` / ``anon``; the rest is page cache and kernel
  memory), p50 and max over the browsers; and for comparison the summed RSS of the
  sandbox's Chromium processes from ``ps`` inside (over-counts shared pages).

The host side needs root (the local backend's cgroups, ``<mount>/orchard/<tenant group>/<id>``,
``tests/cgroup_paths.py``). Prints one JSON object. Bounded: ``--n`` steps (at most 1000),
``--browsers`` sandboxes (at most 24), the whole run within ``--deadline`` seconds.

    flock /tmp/orchard-heavy.lock .venv/bin/python -m loadtest.bench_gui [--n 100] [--browsers 6]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from orchard.recipes.gui.actions import Click
from orchard.recipes.gui.browser import BrowserEnv, browser_sandbox_options
from orchard.recipes.gui.miniwob import MiniWoBTask

import orchard
from loadtest.bench_processes import summary
from tests.cgroup_paths import sandbox_cgroup_dirs
from tests.stack import running_stack

MIB = 1 << 20
MAX_N = 1000
MAX_BROWSERS = 24


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


_CHROMIUM_RSS = "ps -eo rss=,args= | awk '/chromium/ {s += $1} END {print s + 0}'"
# (hierarchy under /sys/fs/cgroup, charge now, peak, memory.stat key of the anonymous part)
_CGROUP_FILES = (
    ("memory", "memory.usage_in_bytes", "memory.max_usage_in_bytes", "total_rss"),  # v1
    ("unified", "memory.current", "memory.peak", "anon"),  # v2 beside v1 (hybrid)
    ("", "memory.current", "memory.peak", "anon"),  # v2 only
)


def cgroup_memory(sandbox_id: str) -> dict[str, int] | None:
    """The sandbox's memory cgroup as the host sees it: bytes charged now, the peak, and the
    anonymous part of the charge; None if no hierarchy has its memory files."""
    for hierarchy, current, peak, anon in _CGROUP_FILES:
        for folder in map(Path, sandbox_cgroup_dirs(sandbox_id, hierarchy)):
            try:
                stat = dict(
                    line.split() for line in (folder / "memory.stat").read_text().splitlines()
                )
                return {
                    "current": int((folder / current).read_text()),
                    "peak": int((folder / peak).read_text()),
                    "anon": int(stat[anon]),
                }
            except (OSError, KeyError, ValueError):
                continue
    return None


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
        cgroup = await asyncio.to_thread(cgroup_memory, env.sandbox.id)
        probe = await env.sandbox.exec(["sh", "-c", _CHROMIUM_RSS], timeout=30)
        return {"ok": True, "seconds": ready, "cgroup": cgroup,
                "chromium_rss_kib": int(probe.stdout_text.split()[0])}  # fmt: skip
    except orchard.OrchardError as err:
        return {"ok": False, "error": f"{type(err).__name__}: {err}"[:300]}
    finally:
        await env.close()


async def _density(client: orchard.AsyncOrchard, count: int, memory: str) -> dict[str, Any]:
    started = time.perf_counter()
    results = await asyncio.gather(*(_one_browser(client, memory, i) for i in range(count)))
    ok = [r for r in results if r["ok"]]
    charged = [r["cgroup"] for r in ok if r["cgroup"] is not None]
    return {
        "browsers": count,
        "memory_cap": memory,
        "answered": len(ok),
        "wall_seconds": round(time.perf_counter() - started, 2),
        "ready_seconds_max": round(max((r["seconds"] for r in ok), default=0.0), 2),
        "cgroup_read": len(charged),
        "cgroup_current_mib": _p50_max([c["current"] for c in charged]),
        "cgroup_peak_mib": _p50_max([c["peak"] for c in charged]),
        "cgroup_anon_mib": _p50_max([c["anon"] for c in charged]),
        "chromium_rss_mib": _p50_max([r["chromium_rss_kib"] * 1024 for r in ok]),
        "errors": [r["error"] for r in results if not r["ok"]][:5],
    }


def _p50_max(values: list[int]) -> dict[str, float] | None:
    """Bytes -> {"p50", "max"} in MiB (None when nothing was measured)."""
    if not values:
        return None
    return {"p50": round(statistics.median(values) / MIB, 1), "max": round(max(values) / MIB, 1)}


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
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=100, help=f"steps per transport, 1..{MAX_N}")
    parser.add_argument(
        "--browsers", type=int, default=6, help=f"sandboxes at once, 1..{MAX_BROWSERS}"
    )
    parser.add_argument("--memory", default="512Mi", help="memory cap of each browser sandbox")
    parser.add_argument("--deadline", type=float, default=900.0, help="seconds for the whole run")
    parser.add_argument("--screenshot", type=Path, default=None, help="save the first PNG here")
    args = parser.parse_args()
    if not 1 <= args.n <= MAX_N or not 1 <= args.browsers <= MAX_BROWSERS:
        parser.error(f"--n must be 1..{MAX_N} and --browsers 1..{MAX_BROWSERS}")
    with tempfile.TemporaryDirectory() as tmp, running_stack(Path(tmp) / "home") as stack:
        key = (stack.home / "dev-api-key").read_text().strip()
        run = _run(stack.endpoint, key, args.n, args.browsers, args.memory, args.screenshot)
        result = asyncio.run(asyncio.wait_for(run, args.deadline))
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
