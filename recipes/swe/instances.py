"""SWE instance rows -> :class:`orchard.rollouts.Task` (the rollout's view of a task).

A row is the shape the rewards service grades (docs/rewards.md: ``instance_id``,
``problem_statement``, ``image``, ``workdir``, ``FAIL_TO_PASS``, ..., at the top level or
under ``metadata``). The row itself rides in ``Task.metadata["instance"]`` so the grader gets
exactly what was loaded. Rows with ``repo_files`` (images without a repository of their own,
the bundled samples) have the files written into the workdir and committed as the base, the
same way the grader lays them out; real SWE-bench-style images already hold the repository.

This is the minimal loader the runner needs; the dataset loaders with per-format validation
(SWE-bench, SWE-rebench, SWE-Gym, Scale-SWE) live in ``orchard.recipes.swe.tasks`` and produce
the same rows.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from orchard.rollouts import Task

SAMPLES = Path(__file__).parent / "samples" / "instances.jsonl"
DEFAULT_WORKDIR = "/testbed"
DEFAULT_IMAGE = "debian:bookworm"


class InstanceError(ValueError):
    """A row that cannot become a task (the message names the row and the field)."""


def _flat(row: Mapping[str, Any]) -> dict[str, Any]:
    flat = dict(row)
    metadata = row.get("metadata")
    if isinstance(metadata, str):
        try:
            metadata = json.loads(metadata)
        except ValueError:
            metadata = None
    if isinstance(metadata, Mapping):
        flat.update(metadata)
    return flat


def image_of(row: Mapping[str, Any]) -> str:
    flat = _flat(row)
    for key in ("image", "image_url", "image_name"):
        if isinstance(flat.get(key), str) and flat[key]:
            return str(flat[key])
    instance_id = str(flat.get("instance_id", ""))
    return "swebench/sweb.eval.x86_64." + instance_id.replace("__", "_1776_").lower()


def to_task(row: Mapping[str, Any], where: str = "row") -> Task:
    """One instance row as a rollout task; :class:`InstanceError` names what is wrong."""
    if not isinstance(row, Mapping):
        raise InstanceError(f"{where}: not a JSON object")
    flat = _flat(row)
    instance_id = flat.get("instance_id")
    if not isinstance(instance_id, str) or not instance_id:
        raise InstanceError(f"{where}: instance_id: required (a non-empty string)")
    where = f"{where} ({instance_id})"
    problem = flat.get("problem_statement")
    if not isinstance(problem, str) or not problem.strip():
        raise InstanceError(f"{where}: problem_statement: required (a non-empty string)")
    workdir = flat.get("workdir") or DEFAULT_WORKDIR
    if not isinstance(workdir, str) or not workdir.startswith("/"):
        raise InstanceError(f"{where}: workdir: must be an absolute path")
    files: dict[str, bytes] = {}
    setup: list[str] = []
    repo_files = flat.get("repo_files") or {}
    if isinstance(repo_files, str):
        try:
            repo_files = json.loads(repo_files)
        except ValueError:
            raise InstanceError(f"{where}: repo_files: not valid JSON") from None
    if not isinstance(repo_files, Mapping):
        raise InstanceError(f"{where}: repo_files: must map relative paths to file contents")
    for path, text in repo_files.items():
        if not isinstance(path, str) or not path or path.startswith("/") or ".." in path.split("/"):
            raise InstanceError(f"{where}: repo_files: {path!r} is not a relative path")
        if not isinstance(text, str):
            raise InstanceError(f"{where}: repo_files[{path!r}]: must be text")
        files[f"{workdir.rstrip('/')}/{path}"] = text.encode()
    if files:
        setup.append(
            f"cd {shlex.quote(workdir)} && git init -q && git add -A && "
            "git -c user.name=orchard -c user.email=orchard@localhost commit -qm base"
        )
    return Task(
        id=instance_id,
        prompt=problem,
        image=image_of(flat),
        workdir=workdir,
        files=files,
        setup=tuple(setup),
        metadata={"instance": dict(row)},
    )


def load_rows(path: str | Path) -> list[dict[str, Any]]:
    """The rows of a JSONL file (blank lines skipped); a bad line names its number."""
    rows: list[dict[str, Any]] = []
    text = Path(path).read_text()
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except ValueError as err:
            raise InstanceError(f"{path}:{number}: not valid JSON ({err})") from None
        if not isinstance(row, dict):
            raise InstanceError(f"{path}:{number}: not a JSON object")
        rows.append(row)
    if not rows:
        raise InstanceError(f"{path}: no rows")
    return rows


def load_tasks(path: str | Path = SAMPLES) -> list[Task]:
    return tasks_of(load_rows(path), str(path))


def tasks_of(rows: Sequence[Mapping[str, Any]], source: str = "rows") -> list[Task]:
    tasks = [to_task(row, f"{source}:{i + 1}") for i, row in enumerate(rows)]
    seen: set[str] = set()
    for task in tasks:
        if task.id in seen:
            raise InstanceError(f"{source}: instance_id {task.id!r} appears twice")
        seen.add(task.id)
    return tasks


def instance_of(task: Task) -> dict[str, Any]:
    """The row a task was made from (what the grader is given)."""
    row = task.metadata.get("instance")
    if not isinstance(row, dict):
        raise InstanceError(f"task {task.id}: no instance row in its metadata")
    return row
