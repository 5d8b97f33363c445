"""Writing a generation run: the kept tasks where the runner loads them, and the manifest.

``out/`` after a run:

- ``tasks/<id>.json``: each kept task, as :meth:`TaskBackend.to_json` gives it (the
  recipe's own format: the runner loads the folder as is);
- ``manifest.jsonl``: one line per idea (appended to: a later run on the same folder adds
  its lines), kept or rejected (:meth:`.loop.Outcome.row`): the
  reason, every build/revise attempt's errors, every validation's oracle and null trials,
  the solve trials, and the cost (tokens per stage, model calls, wall and sandbox seconds);
- ``summary.json``: counts by reason and the run's cost (:func:`.costs.summarise`).

Task files and the summary are written to a temporary name and renamed, so a reader never
sees half a file; a task id is checked to be a slug again before it becomes a file name, and
a kept task whose file already exists (an id taken since) is refused, never overwritten.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from .ideas import ID_PATTERN
from .loop import Report


def _write(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def write_report(report: Report, out: Path, options: dict[str, Any]) -> dict[str, Any]:
    """Write ``report`` under ``out``; the summary written (with ``options`` in it)."""
    tasks = out / "tasks"
    tasks.mkdir(parents=True, exist_ok=True)
    for outcome in report.kept:
        if not ID_PATTERN.fullmatch(outcome.id):
            raise ValueError(f"refusing to write task id {outcome.id!r} as a file name")
        target = tasks / f"{outcome.id}.json"
        if target.exists():
            raise FileExistsError(f"{target} exists: task ids must be new")
        _write(target, json.dumps(outcome.task, indent=2, ensure_ascii=False) + "\n")
    with (out / "manifest.jsonl").open("a") as manifest:
        for outcome in report.outcomes:
            manifest.write(json.dumps(outcome.row(), ensure_ascii=False) + "\n")
    summary = {"options": options, **report.summary()}
    _write(out / "summary.json", json.dumps(summary, indent=2) + "\n")
    return summary
