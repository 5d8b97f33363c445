"""What one task cost to make: model usage per stage, wall time, sandbox time.

Per idea (kept or not) a :class:`TaskCost` sums the proxy-recorded usage of each stage
(``propose`` is the idea's share of its proposal: the proposal's usage divided by the
ideas it yielded, remainders on the first), the wall time spent on the idea, and the
seconds its trials held sandboxes. :func:`summarise` totals a run: spent on everything,
and per kept task (what the kept set cost, rejected work included, divided by the kept).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from .model import Usage

STAGES = ("propose", "build", "revise", "solve")


@dataclass
class TaskCost:
    stages: dict[str, Usage] = field(default_factory=lambda: {s: Usage() for s in STAGES})
    wall_seconds: float = 0.0
    sandbox_seconds: float = 0.0

    def add(self, stage: str, usage: Usage) -> None:
        self.stages[stage].add(usage)

    @property
    def total(self) -> Usage:
        total = Usage()
        for usage in self.stages.values():
            total.add(usage)
        return total

    def as_dict(self) -> dict[str, Any]:
        total = self.total
        return {
            "stages": {name: usage.as_dict() for name, usage in self.stages.items()},
            "model_calls": total.calls,
            "prompt_tokens": total.prompt_tokens,
            "completion_tokens": total.completion_tokens,
            "wall_seconds": round(self.wall_seconds, 3),
            "sandbox_seconds": round(self.sandbox_seconds, 3),
        }


def shares(usage: Usage, parts: int) -> list[Usage]:
    """``usage`` split over ``parts`` ideas (integer tokens and calls; remainders first)."""
    if parts < 1:
        return []
    out = []
    for i in range(parts):

        def cut(total: int, i: int = i) -> int:
            return total // parts + (1 if i < total % parts else 0)

        out.append(Usage(cut(usage.calls), cut(usage.prompt_tokens),
                         cut(usage.completion_tokens), usage.seconds / parts))  # fmt: skip
    return out


def summarise(
    costs: Iterable[tuple[bool, TaskCost]], unattributed: Mapping[str, Usage]
) -> dict[str, Any]:
    """Totals of a run: ``costs`` are (kept, cost) per idea; ``unattributed`` is usage no
    idea carries (a proposal that yielded no idea)."""
    everything, kept_cost = TaskCost(), TaskCost()
    kept = 0
    for is_kept, cost in costs:
        for name, usage in cost.stages.items():
            everything.add(name, usage)
            if is_kept:
                kept_cost.add(name, usage)
        everything.wall_seconds += cost.wall_seconds
        everything.sandbox_seconds += cost.sandbox_seconds
        if is_kept:
            kept += 1
            kept_cost.wall_seconds += cost.wall_seconds
            kept_cost.sandbox_seconds += cost.sandbox_seconds
    for name, usage in unattributed.items():
        everything.add(name, usage)
    spent = everything.as_dict()
    per_kept: dict[str, Any] | None = None
    if kept:
        total = everything.total
        per_kept = {
            "model_calls": round(total.calls / kept, 2),
            "prompt_tokens": round(total.prompt_tokens / kept, 1),
            "completion_tokens": round(total.completion_tokens / kept, 1),
            "sandbox_seconds": round(everything.sandbox_seconds / kept, 3),
            "wall_seconds": round(everything.wall_seconds / kept, 3),
        }
    return {"spent": spent, "kept_tasks_own": kept_cost.as_dict(), "per_kept_task": per_kept}
