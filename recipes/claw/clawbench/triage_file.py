"""The checked-in triage (``triage.json`` beside this module): which claw-bench tasks run here.

Written by ``python -m orchard.recipes.claw.clawbench check --write-triage`` from a check over
every task; read by the task loader (:mod:`.convert`: only accepted tasks become Claw tasks),
by ``triage`` and by the tests. Deterministic on purpose (no times, no outputs): a re-run that
changes nothing rewrites the same file, so a diff of it is a change of verdicts.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .check import CheckRun

TRIAGE_PATH = Path(__file__).with_name("triage.json")
FORMAT = 1


def triage_json(run: CheckRun) -> dict[str, Any]:
    tasks = []
    for v in run.verdicts:
        entry = {k: v.to_json()[k] for k in ("id", "rel", "category", "status", "reason", "detail")}
        if v.status == "accepted" and v.reference and v.null:
            entry["checks"] = v.reference.get("checks")
            entry["null_score"] = v.null.get("score")
        tasks.append(entry)
    return {
        "format": FORMAT,
        "claw_bench": run.version,
        "image": run.image,
        "network": "none",
        "task_folders": run.tasks_total,
        "counts": run.counts(),
        "reasons": run.reasons(),
        "tasks": tasks,
    }


def write_triage(run: CheckRun, path: Path = TRIAGE_PATH) -> None:
    errors = [v.id for v in run.verdicts if v.status == "error"]
    if errors:
        raise RuntimeError(f"not writing {path.name}: the platform failed on {', '.join(errors)}")
    path.write_text(json.dumps(triage_json(run), indent=1, ensure_ascii=False) + "\n")


def load_triage(path: Path = TRIAGE_PATH) -> dict[str, Any]:
    data = json.loads(path.read_text())
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise ValueError(f"{path}: not a format-{FORMAT} claw-bench triage")
    return data


def accepted_ids(path: Path = TRIAGE_PATH) -> list[str]:
    return [e["id"] for e in load_triage(path)["tasks"] if e["status"] == "accepted"]
