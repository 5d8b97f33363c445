"""What a load run left behind on the host, counted for one stack's home.

Everything is scoped to the sandboxes this home's store has ever known, so
other stacks on the same machine (other tests, other engineers) do not count:

- ``store_rows``: rows of ``<home>/state.db`` by state; ``non_terminal`` are the
  ones still pending, ready, claimed or deleting;
- ``init_processes``: processes in those sandboxes' cgroups (orchard-init and below);
- ``overlay_mounts``: mounts under the home (sandbox roots);
- ``cgroups``: ``/sys/fs/cgroup/<controller>/orchard/<tenant group>/<id>`` folders of those ids;
- ``netns``: distinct network namespaces held by those processes (policy ``none``
  gives each container an unnamed one, gone with its processes) plus host veth
  ends of those ids (networked policies);
- ``sandbox_dirs``: folders left in ``<home>/sandboxes``.
"""

from __future__ import annotations

import hashlib
import os
import sqlite3
from pathlib import Path
from typing import Any

from loadtest.density import sandbox_pids
from tests.cgroup_paths import count_sandbox_cgroups

STATE_NAMES = {1: "pending", 2: "ready", 3: "deleting", 4: "deleted", 5: "failed", 6: "claimed"}
NON_TERMINAL = ("pending", "ready", "deleting", "claimed")


def store_rows(home: Path) -> tuple[dict[str, int], list[str]]:
    """Row counts by state, and every sandbox id the store knows (read-only)."""
    db = home / "state.db"
    if not db.exists():
        return {}, []
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=30)
    try:
        rows = conn.execute("SELECT id, state FROM sandboxes").fetchall()
    finally:
        conn.close()
    counts: dict[str, int] = {}
    for _, state in rows:
        name = STATE_NAMES.get(state, f"state{state}")
        counts[name] = counts.get(name, 0) + 1
    return counts, [sid for sid, _ in rows]


def _veth_name(sandbox_id: str) -> str:
    # The same name the network policy code gives a sandbox's host veth end.
    return "ov" + hashlib.sha256(sandbox_id.encode()).hexdigest()[:12]


def leftovers(home: Path) -> dict[str, Any]:
    counts, ids = store_rows(home)
    pids = sandbox_pids(ids)
    netns: set[str] = set()
    for pid in pids:
        try:
            netns.add(os.readlink(f"/proc/{pid}/ns/net"))
        except OSError:
            continue
    links = set(os.listdir("/sys/class/net"))
    veths = sum(1 for sid in ids if _veth_name(sid) in links)
    with open("/proc/self/mountinfo") as src:
        mounts = sum(1 for line in src if f" {home}/" in line)
    cgroups = count_sandbox_cgroups(ids)
    sandboxes = home / "sandboxes"
    return {
        "store_rows": counts,
        "non_terminal_rows": sum(counts.get(s, 0) for s in NON_TERMINAL),
        "init_processes": len(pids),
        "overlay_mounts": mounts,
        "cgroups": cgroups,
        "netns": len(netns) + veths,
        "sandbox_dirs": len(list(sandboxes.iterdir())) if sandboxes.is_dir() else 0,
    }


def nothing_left(counts: dict[str, Any]) -> bool:
    return not any(
        counts[k]
        for k in (
            "non_terminal_rows",
            "init_processes",
            "overlay_mounts",
            "cgroups",
            "netns",
            "sandbox_dirs",
        )
    )


def ids_in_state(home: Path, state: str) -> list[str]:
    """Ids of the store's sandboxes in ``state`` (e.g. a warm pool's ready members)."""
    code = next(k for k, v in STATE_NAMES.items() if v == state)
    conn = sqlite3.connect(f"file:{home / 'state.db'}?mode=ro", uri=True, timeout=30)
    try:
        rows = conn.execute("SELECT id FROM sandboxes WHERE state = ?", (code,)).fetchall()
    finally:
        conn.close()
    return [sid for (sid,) in rows]
