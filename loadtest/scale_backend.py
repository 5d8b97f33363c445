"""Backend-level create/delete cost, and how it grows with the sandboxes alive (one JSON line).

Drives ``LocalBackend`` directly (no gRPC): ``--n`` sequential creates then
``--n`` deletes, measured with no other sandbox, again with ``--alive`` idle
sandboxes running (each holds a mount in the host's mount table), and again
after those are gone. Per create/delete: wall ms, CPU ms of runc (this
process's waited-for children), of this process (the backend's Python), and
inside the sandboxes (``cpuacct`` of the parent ``orchard`` cgroup: runc init
and orchard-init).

    flock /tmp/orchard-heavy.lock .venv/bin/python loadtest/scale_backend.py --n 40 --alive 1000
    ORCHARD_SANDBOX_DISK_BYTES=0 ...   # upper/work on the home's filesystem (A/B)
    ORCHARD_SCRATCH_MOUNT=mounted ...  # the pre-6.13 fallback: tmpfs mounted on the host
"""

from __future__ import annotations

import argparse
import asyncio
import json
import resource
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from orchard.executor.initbin import ensure_init_binary
from orchard.scheduler.backends.base import SandboxSpec
from orchard.scheduler.backends.local.backend import LocalBackend
from orchard.scheduler.backends.local.settings import LocalSettings
from orchard.scheduler.backends.netpolicy.policy import NetworkPolicySpec

from tests.stack import IMAGES_DIR

CPUACCT = Path("/sys/fs/cgroup/cpuacct/orchard/cpuacct.usage")


def spec(sandbox_id: str) -> SandboxSpec:
    return SandboxSpec(
        sandbox_id=sandbox_id,
        image="",
        cpu_millis=1000,
        memory_bytes=512 << 20,
        pids=256,
        env={},
        network_mode="none",
        network=NetworkPolicySpec(),
    )


def sample() -> tuple[float, float, float, float]:
    """(wall, runc CPU, own CPU, CPU inside sandboxes), seconds."""
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    own = resource.getrusage(resource.RUSAGE_SELF)
    try:
        inside = int(CPUACCT.read_text()) / 1e9
    except (OSError, ValueError):
        inside = 0.0
    return (
        time.perf_counter(),
        kids.ru_utime + kids.ru_stime,
        own.ru_utime + own.ru_stime,
        inside,
    )


def per_op(before: tuple[float, ...], after: tuple[float, ...], n: int) -> dict[str, float]:
    names = ("wall_ms", "runc_cpu_ms", "backend_cpu_ms", "in_sandbox_cpu_ms")
    return {k: round((b - a) / n * 1000, 2) for k, a, b in zip(names, before, after, strict=True)}


async def churn(backend: LocalBackend, tag: str, n: int) -> dict[str, dict[str, float]]:
    ids = [f"sb-{tag}{i:05d}" for i in range(n)]
    t0 = sample()
    for sid in ids:
        await backend.create(spec(sid))
    t1 = sample()
    for sid in ids:
        await backend.delete(sid)
    t2 = sample()
    return {"create": per_op(t0, t1, n), "delete": per_op(t1, t2, n)}


def host_mounts() -> int:
    return len(Path("/proc/self/mountinfo").read_text().splitlines())


async def main_async(n: int, alive: int) -> dict[str, object]:
    home = Path(tempfile.mkdtemp(prefix="orch-sb-", dir="/tmp"))
    settings = LocalSettings(home=home, images_dir=IMAGES_DIR, init_binary=ensure_init_binary())
    backend = LocalBackend(settings)
    result: dict[str, object] = {
        "n": n,
        "sandbox_disk_bytes": settings.sandbox_disk_bytes,
        "writable_layer": backend.writable_layer.kind,
    }
    idle = [f"sb-idle{i:05d}" for i in range(alive)]
    try:
        await backend.create(spec("sb-warmup0"))
        await backend.delete("sb-warmup0")
        result["host_mounts_at_0"] = host_mounts()
        result["alive_0"] = await churn(backend, "a", n)
        await asyncio.gather(*(backend.create(spec(sid)) for sid in idle))
        result[f"host_mounts_at_{alive}"] = host_mounts()
        result[f"alive_{alive}"] = await churn(backend, "b", n)
        await asyncio.gather(*(backend.delete(sid) for sid in idle))
        result["alive_0_again"] = await churn(backend, "c", n)
    finally:
        for sandbox in await backend.list():
            await backend.delete(sandbox.sandbox_id)
        await backend.close()
        shutil.rmtree(home, ignore_errors=True)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument(
        "--n", type=int, default=40, help="sequential creates (then deletes) measured"
    )
    parser.add_argument("--alive", type=int, default=1000, help="idle sandboxes for the slope")
    args = parser.parse_args()
    print(json.dumps(asyncio.run(main_async(args.n, args.alive))))


if __name__ == "__main__":
    main()
