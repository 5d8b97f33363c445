"""How the cost grows: the cold Locust run at 100, 250, 500 and 1000 sandboxes; JSON and a plot.

For each count N, ``run_locust.run`` on a fresh stack (N users at once: create
-> the original's four commands -> delete, then N idle sandboxes measured).
Against N: wall time (and wall / N, flat when nothing is quadratic), peak host
memory over the baseline, PSS per idle sandbox, each command's p99.

Writes ``build/loadtest/scale.json`` and ``docs/scaling.png``, prints the JSON.

    flock /tmp/orchard-heavy.lock .venv/bin/python loadtest/scale.py [--counts 100,250,500,1000]
    (or: make scale)
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from loadtest import run_locust  # noqa: E402
from loadtest.locust_checks import COMMANDS  # noqa: E402

EXEC_NAMES = [name for name, _, _ in COMMANDS]


def point(n: int, summary: dict[str, Any]) -> dict[str, Any]:
    """The figures of one run that the table and the plot need."""
    ops = summary["operations"]
    idle = summary.get("idle_memory", {}).get("per_sandbox", {})
    return {
        "sandboxes": n,
        "success_rate": summary["success_rate"],
        "failed_requests": summary["failed_requests"],
        "wall_s": summary["wall_s"],
        "wall_ms_per_sandbox": round(summary["wall_s"] * 1000 / n, 1),
        "all_created_s": summary["phases"]["all_created_s"],
        "all_executed_s": summary["phases"]["all_executed_s"],
        "commands_per_s": summary["commands_per_s"],
        "peak_memory_over_baseline_mib": summary["host_memory"]["peak_over_baseline_mib"],
        "peak_memory_mib_per_sandbox": round(
            summary["host_memory"]["peak_over_baseline_mib"] / n, 2
        ),
        "idle_pss_mib_per_sandbox": idle.get("pss_mib"),
        "idle_cgroup_charged_mib_per_sandbox": idle.get("cgroup_charged_mib"),
        "idle_memavailable_drop_mib_per_sandbox": idle.get("memavailable_drop_mib"),
        "create_p99_ms": ops["create"]["p99_ms"],
        "exec_p99_ms": {name: ops[name]["p99_ms"] for name in EXEC_NAMES},
        "delete_p99_ms": ops["delete"]["p99_ms"],
        "probe_max_ms": summary["liveness_probe"]["create_exec_ms"]["max"],
        "locust_share_of_busy_cpu": summary["cpu"]["locust_share_of_busy"],
        "nothing_left_after_stop": summary["nothing_left_after_stop"],
    }


def plot(points: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    counts = [p["sandboxes"] for p in points]
    fig, axes = plt.subplots(2, 2, figsize=(11, 8))
    ax = axes[0][0]
    ax.plot(counts, [p["wall_s"] for p in points], "o-", label="wall")
    ax.plot(counts, [p["all_created_s"] for p in points], "s--", label="all created")
    ax.set_title("wall time (s)")
    ax.legend()
    ax = axes[0][1]
    ax.plot(counts, [p["wall_ms_per_sandbox"] for p in points], "o-")
    ax.set_title("wall time per sandbox (ms): flat = linear growth")
    ax.set_ylim(bottom=0)
    ax = axes[1][0]
    ax.plot(counts, [p["peak_memory_mib_per_sandbox"] for p in points], "o-", label="peak / N")
    ax.plot(counts, [p["idle_pss_mib_per_sandbox"] for p in points], "s-", label="idle PSS / N")
    ax.plot(
        counts,
        [p["idle_cgroup_charged_mib_per_sandbox"] for p in points],
        "^--",
        label="idle, charged to its cgroup",
    )
    ax.set_title("host memory per sandbox (MiB; peak is machine-wide, noisy)")
    ax.set_ylim(bottom=0)
    ax.legend()
    ax = axes[1][1]
    for name in EXEC_NAMES:
        ax.plot(counts, [p["exec_p99_ms"][name] / 1000 for p in points], "o-", label=name)
    ax.set_title("p99 exec latency under load (s)")
    ax.legend(fontsize="small")
    for row in axes:
        for a in row:
            a.set_xlabel("concurrent sandboxes")
            a.set_xticks(counts)
            a.grid(alpha=0.3)
    fig.suptitle("Orchard, one 2-core machine: N users at once, create -> 4 commands -> delete")
    fig.tight_layout()
    fig.savefig(path, dpi=90)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--counts", default="100,250,500,1000")
    parser.add_argument("--out", type=Path, default=ROOT / "build" / "loadtest")
    parser.add_argument("--png", type=Path, default=ROOT / "docs" / "scaling.png")
    args = parser.parse_args()
    points = []
    for n in (int(c) for c in args.counts.split(",")):
        summary = run_locust.run(n, "cold", args.out / f"scale-cold-{n}")
        points.append(point(n, summary))
    result = {"benchmark": "scaling: cold Locust run against N", "points": points}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "scale.json").write_text(json.dumps(result, indent=2))
    plot(points, args.png)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
