"""Where the machine's CPU went during a load run: the load generator, the stack, the rest.

Answers "is the client the bottleneck?" with numbers: CPU seconds (user + system)
of the Locust process tree (``RUSAGE_CHILDREN`` around the run: Locust and its
``--processes`` workers), of each stack service (``/proc/<pid>/stat``), and of
the whole machine (``/proc/stat``), whose remainder is the sandboxes' side:
runc, mounts, the commands themselves, kernel work, and anything else running
on the box.
"""

from __future__ import annotations

import os
import resource
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from loadtest.density import service_pids

TICKS = os.sysconf("SC_CLK_TCK")


def process_cpu_seconds(pid: int) -> float:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / TICKS  # utime + stime


def machine_cpu_seconds() -> tuple[float, float]:
    """(busy, total) CPU seconds of all cores since boot."""
    with open("/proc/stat") as src:
        values = [int(v) for v in src.readline().split()[1:]]
    idle = values[3] + values[4]  # idle + iowait
    total = sum(values[:8])  # up to steal; guest time is already in user
    return (total - idle) / TICKS, total / TICKS


def children_cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


@dataclass
class CpuSnapshot:
    children: float
    services: dict[str, float]
    machine_busy: float
    machine_total: float

    @classmethod
    def take(cls, home: Path) -> CpuSnapshot:
        busy, total = machine_cpu_seconds()
        services = {n: process_cpu_seconds(p) for n, p in service_pids(home).items()}
        return cls(children_cpu_seconds(), services, busy, total)


def cpu_breakdown(before: CpuSnapshot, after: CpuSnapshot, wall: float) -> dict[str, Any]:
    """CPU seconds by consumer between two snapshots; ``wall`` is the run's own wall time."""
    cores = os.cpu_count() or 1
    busy = after.machine_busy - before.machine_busy
    total = after.machine_total - before.machine_total
    locust = after.children - before.children
    services = {
        name: round(after.services[name] - before.services.get(name, 0.0), 2)
        for name in after.services
    }
    rest = busy - locust - sum(services.values())
    return {
        "cores": cores,
        "window_s": round(total / cores, 2),
        "machine_busy_fraction": round(busy / total, 3) if total else None,
        "cpu_s": {
            "locust": round(locust, 2),
            **{f"stack_{k}": v for k, v in sorted(services.items())},
            "rest_runc_sandboxes_kernel_other": round(rest, 2),
            "machine_busy": round(busy, 2),
        },
        "locust_share_of_busy": round(locust / busy, 3) if busy else None,
        "locust_cores_used_over_run": round(locust / wall, 2) if wall else None,
    }
