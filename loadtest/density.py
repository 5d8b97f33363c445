"""Host memory, read from /proc: a peak sampler for load runs and the cost of idle sandboxes.

Per idle sandbox we report three honest views, since none alone is the truth:

- **PSS** (proportional set size, ``/proc/<pid>/smaps_rollup``): every process in
  the sandboxes' cgroups (orchard-init, its spare shim) plus the share of the
  stack's own processes (the node executor, and scheduler and gateway, whose
  memory grows with the number of sandboxes) divided by N. Shared pages (the
  image's libraries, read through the same overlay lower layers) count once,
  split between their users: that is what PSS is for.
- **MemAvailable drop / N**: what the host can no longer give to anyone else;
  includes the kernel's side (page tables, slab for mounts, cgroups,
  namespaces, overlay inodes) and page cache that the idle sandboxes pinned.
- **cgroup-charged / N**: ``memory.usage_in_bytes`` of the sandboxes' own memory
  cgroups: their pages and the page cache and kernel objects charged to them,
  scoped to them alone (MemAvailable moves with everything else on a shared box).
- **Kernel deltas / N**: Slab, SUnreclaim, KernelStack, PageTables, Shmem from
  ``/proc/meminfo``, so the kernel's share is visible on its own.
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.cgroup_paths import sandbox_cgroup_map

MIB = 1 << 20
CGROUP_ROOT = Path("/sys/fs/cgroup")
KERNEL_KEYS = ("Slab", "SUnreclaim", "KernelStack", "PageTables", "Shmem")


def meminfo() -> dict[str, int]:
    """/proc/meminfo in bytes."""
    out: dict[str, int] = {}
    with open("/proc/meminfo") as src:
        for line in src:
            name, _, rest = line.partition(":")
            parts = rest.split()
            if parts:
                out[name] = int(parts[0]) * 1024
    return out


def used_bytes(info: dict[str, int] | None = None) -> int:
    """Host memory in use: MemTotal - MemAvailable."""
    info = info if info is not None else meminfo()
    return info["MemTotal"] - info["MemAvailable"]


def pss_bytes(pid: int) -> int:
    """A process's PSS (0 if it is gone or unreadable)."""
    try:
        with open(f"/proc/{pid}/smaps_rollup") as src:
            for line in src:
                if line.startswith("Pss:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def memory_cgroups() -> dict[str, Path]:
    """Sandbox id -> its memory cgroup (v1 ``memory/orchard/<group>/<id>``, else v2)."""
    return sandbox_cgroup_map("memory") or sandbox_cgroup_map("unified") or sandbox_cgroup_map("")


def sandbox_pids(sandbox_ids: list[str]) -> list[int]:
    """Every process in the given sandboxes' cgroups."""
    folders = memory_cgroups()
    pids: list[int] = []
    for sid in sandbox_ids:
        try:
            pids += [int(p) for p in (folders[sid] / "cgroup.procs").read_text().split()]
        except (KeyError, OSError):
            continue
    return pids


def service_pids(home: Path) -> dict[str, int]:
    """The pids of the stack's services for ``home`` (``python -m orchard.<svc> --home HOME``)."""
    found: dict[str, int] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            argv = Path(f"/proc/{entry.name}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"--home" not in argv or str(home).encode() not in argv:
            continue
        for arg in argv:
            if arg.startswith(b"orchard.") and b"." in arg:
                found[arg.decode().split(".", 1)[1]] = int(entry.name)
    return found


def cgroup_charged_bytes(sandbox_ids: list[str]) -> int:
    """Memory the kernel charged to the sandboxes' memory cgroups (their pages, page cache they
    touched and, where kernel memory is accounted, slab): scoped to these sandboxes only, so
    unlike MemAvailable it does not move with the rest of a shared machine."""
    folders = memory_cgroups()
    names = ("memory.usage_in_bytes", "memory.current")  # cgroup v1, v2
    total = 0
    for sid in sandbox_ids:
        folder = folders.get(sid)
        for name in names if folder is not None else ():
            try:
                total += int((folder / name).read_text())
                break
            except (OSError, ValueError):
                continue
    return total


@dataclass
class MemorySnapshot:
    """What the idle-cost figures are computed from (taken before and after N sandboxes)."""

    info: dict[str, int]
    services_pss: dict[str, int]

    @classmethod
    def take(cls, home: Path) -> MemorySnapshot:
        return cls(meminfo(), {n: pss_bytes(p) for n, p in service_pids(home).items()})


def idle_cost(before: MemorySnapshot, sandbox_ids: list[str], home: Path) -> dict[str, Any]:
    """Memory per idle sandbox, with ``sandbox_ids`` alive and idle now."""
    n = max(1, len(sandbox_ids))
    after = MemorySnapshot.take(home)
    pids = sandbox_pids(sandbox_ids)
    sandbox_pss = sum(pss_bytes(p) for p in pids)
    charged = cgroup_charged_bytes(sandbox_ids)
    growth = {
        name: after.services_pss.get(name, 0) - before.services_pss.get(name, 0)
        for name in after.services_pss
    }
    executor_share = after.services_pss.get("executor", 0)
    per = {
        "sandboxes": len(sandbox_ids),
        "processes_per_sandbox": round(len(pids) / n, 2),
        "sandbox_processes_pss_mib": round(sandbox_pss / n / MIB, 3),
        "executor_pss_share_mib": round(executor_share / n / MIB, 3),
        "pss_mib": round((sandbox_pss + executor_share) / n / MIB, 3),
        "services_growth_mib": {k: round(v / n / MIB, 3) for k, v in sorted(growth.items())},
        "cgroup_charged_mib": round(charged / n / MIB, 3),
        "memavailable_drop_mib": round(
            (before.info["MemAvailable"] - after.info["MemAvailable"]) / n / MIB, 3
        ),
        "kernel_delta_mib": {
            k: round((after.info.get(k, 0) - before.info.get(k, 0)) / n / MIB, 3)
            for k in KERNEL_KEYS
        },
    }
    return {
        "per_sandbox": per,
        "totals_mib": {
            "sandbox_processes_pss": round(sandbox_pss / MIB, 1),
            "services_pss": {k: round(v / MIB, 1) for k, v in sorted(after.services_pss.items())},
        },
    }


@dataclass
class PeakMemory:
    """Samples host memory in use every ``interval`` seconds on a thread; keeps the peak."""

    interval: float = 0.1
    baseline: int = field(default_factory=used_bytes)
    peak: int = 0
    samples: int = 0
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> None:
        self.peak = self.baseline
        self._thread = threading.Thread(target=self._run, name="peak-memory", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, used_bytes())
            self.samples += 1
            self._stop.wait(self.interval)

    def stop(self) -> dict[str, Any]:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        return {
            "baseline_used_mib": round(self.baseline / MIB, 1),
            "peak_used_mib": round(self.peak / MIB, 1),
            "peak_over_baseline_mib": round((self.peak - self.baseline) / MIB, 1),
            "samples": self.samples,
            "interval_s": self.interval,
        }
