"""The seven rubrics and their weights (the original's; they sum to 1)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Rubric:
    key: str
    name: str
    weight: float
    question: str
    uses_reference: bool = False
    """Only these may see the reference block (gold patch, FAIL_TO_PASS ids)."""


RUBRICS: tuple[Rubric, ...] = (
    Rubric("R1", "fix quality", 0.15, "Is the final patch a correct, minimal, idiomatic fix of the root cause?"),
    Rubric("R2", "reproduction", 0.18, "Did the agent show the bug before the fix and its absence after?", True),
    Rubric("R3", "coverage", 0.12, "Do the agent's own checks cover the cases the task names, edge cases included?", True),
    Rubric("R4", "rigor", 0.15, "Do the checks use real assertions (not prints read by eye)?"),
    Rubric("R5", "discriminativeness", 0.14, "Would the agent's checks fail on a wrong patch?", True),
    Rubric("R6", "regression guard", 0.12, "Did the agent run the existing tests around the change?"),
    Rubric("R7", "verification integrity", 0.14, "Were failures faced rather than ignored, and did tests really run (not zero collected)?"),
)  # fmt: skip

WEIGHTS: dict[str, float] = {r.key: r.weight for r in RUBRICS}
GRID = 0.1


def snap(score: float) -> float:
    """Clamp to [0, 1] and round to the 0.1 grid."""
    return round(min(1.0, max(0.0, score)) / GRID) * GRID


def weighted_mean(scores: dict[str, float]) -> float:
    """J: the weighted mean of the snapped rubric scores (all seven required)."""
    return sum(WEIGHTS[k] * snap(scores[k]) for k in WEIGHTS) / sum(WEIGHTS.values())
