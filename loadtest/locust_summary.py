"""Turn a Locust run's CSV and the locustfile's phase marks into the JSON summary's load figures.

Per-operation counts and p50/p90/p99 come from Locust's own ``<prefix>_stats.csv``
(so they are the numbers of its report; Locust rounds percentiles above 100 ms
to two significant digits). Wall time and phases come from the users' own
marks (epoch seconds, written by every Locust process): from the first user's
start to the moment the last one had created, had run its four commands, and
had deleted; the phases overlap, since every user runs its own chain.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any

EXEC_PREFIX = "exec "


def _number(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None


def operation_stats(stats_csv: Path) -> dict[str, dict[str, Any]]:
    """name -> requests, failures, p50/p90/p99/max (ms), from Locust's stats CSV."""
    out: dict[str, dict[str, Any]] = {}
    with stats_csv.open(newline="") as src:
        for row in csv.DictReader(src):
            name = row["Name"]
            out[name] = {
                "requests": int(row["Request Count"]),
                "failures": int(row["Failure Count"]),
                "p50_ms": _number(row["50%"]),
                "p90_ms": _number(row["90%"]),
                "p99_ms": _number(row["99%"]),
                "max_ms": _number(row["Max Response Time"]),
            }
    return out


def failures(failures_csv: Path, limit: int = 10) -> list[dict[str, Any]]:
    if not failures_csv.exists():
        return []
    with failures_csv.open(newline="") as src:
        rows = list(csv.DictReader(src))
    return [
        {"name": r["Name"], "occurrences": int(r["Occurrences"]), "error": r["Error"][:300]}
        for r in rows[:limit]
    ]


def read_phases(folder: Path) -> list[dict[str, Any]]:
    marks: list[dict[str, Any]] = []
    for path in sorted(folder.glob("phases-*.json")):
        marks += json.loads(path.read_text())
    return marks


def phase_times(marks: list[dict[str, Any]]) -> dict[str, Any]:
    """Seconds from the first user's start until all users had created / executed / deleted."""
    if not marks:
        return {"users": 0}
    t0 = min(m["start"] for m in marks)

    def last(key: str) -> float | None:
        done = [m[key] for m in marks if key in m]
        return round(max(done) - t0, 3) if len(done) == len(marks) else None

    return {
        "users": len(marks),
        "users_ok": sum(1 for m in marks if m.get("ok")),
        "spawn_spread_s": round(max(m["start"] for m in marks) - t0, 3),
        "all_created_s": last("created"),
        "all_executed_s": last("executed"),
        "all_deleted_s": last("deleted"),
        "wall_s": round(max(m["end"] for m in marks) - t0, 3),
    }


def load_summary(prefix: Path, phases_dir: Path, users: int) -> dict[str, Any]:
    ops = operation_stats(prefix.with_name(prefix.name + "_stats.csv"))
    total = ops.pop("Aggregated", None)
    phases = phase_times(read_phases(phases_dir))
    execs = sum(v["requests"] for k, v in ops.items() if k.startswith(EXEC_PREFIX))
    requests = total["requests"] if total else 0
    failed = total["failures"] if total else 0
    wall = phases.get("wall_s") or 0.0
    users_ok = phases.get("users_ok", 0)
    return {
        "users": users,
        "users_ok": users_ok,
        "success_rate": round(users_ok / users, 4) if users else 0.0,
        "requests": requests,
        "failed_requests": failed,
        "request_success_rate": round((requests - failed) / requests, 4) if requests else 0.0,
        "wall_s": wall,
        "phases": phases,
        "commands_per_s": round(execs / wall, 1) if wall else None,
        "operations": ops,
        "failures": failures(prefix.with_name(prefix.name + "_failures.csv")),
    }
