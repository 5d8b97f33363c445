"""The trajectory store: one JSON object per line (JSONL), append-only.

Each line (a :class:`Rollout`)::

    {"task_id": "django__django-11099", "task": "<problem statement>",
     "trajectory": [{"role": "assistant", "content": "..."}, {"role": "tool", ...}],
     "patch": "diff --git ...", "resolved": true, "reward": 1.0,
     "rollout_id": "r-17", "meta": {"model": "...", "kind": "graded"}}

``resolved`` is the label (the SWE grader's verdict). Infrastructure failures
are not stored (they carry no label). Appends are one ``write`` of one line
under an ``O_APPEND`` handle, so concurrent writers do not interleave lines.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any


@dataclass
class Rollout:
    task_id: str
    task: str
    trajectory: list[dict[str, Any]]
    patch: str
    resolved: bool
    reward: float = 0.0
    rollout_id: str = ""
    meta: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_dict(cls, row: dict[str, Any]) -> Rollout:
        missing = [
            k for k in ("task_id", "task", "trajectory", "patch", "resolved") if k not in row
        ]
        if missing:
            raise ValueError(f"rollout is missing {missing}")
        return cls(
            task_id=str(row["task_id"]),
            task=str(row["task"]),
            trajectory=list(row["trajectory"]),
            patch=str(row["patch"]),
            resolved=bool(row["resolved"]),
            reward=float(row.get("reward", 0.0)),
            rollout_id=str(row.get("rollout_id", "")),
            meta=dict(row.get("meta") or {}),
        )


class TrajectoryStore:
    def __init__(self, path: Path) -> None:
        self.path = path

    def append(self, rollouts: Iterable[Rollout]) -> int:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        count = 0
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            for rollout in rollouts:
                os.write(fd, (json.dumps(asdict(rollout), ensure_ascii=False) + "\n").encode())
                count += 1
        finally:
            os.close(fd)
        return count

    def __iter__(self) -> Iterator[Rollout]:
        if not self.path.exists():
            return
        with self.path.open() as f:
            for number, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    yield Rollout.from_dict(json.loads(line))
                except (json.JSONDecodeError, ValueError, TypeError) as exc:
                    raise ValueError(f"{self.path}:{number}: bad rollout: {exc}") from None

    def load(self) -> list[Rollout]:
        return list(self)
