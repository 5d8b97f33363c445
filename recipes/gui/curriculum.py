"""The step-budget curriculum: 15 steps per episode, then 30 once the success rate is stable.

The original trained with a 15-step budget and then 30, without saying when it switched.
Our rule, precise so it can be tested:

- The trainer reports one success rate per training round (:meth:`StepCurriculum.record`:
  the share of that round's graded rollouts that succeeded; aborted or dropped rollouts are
  not counted). A round with fewer than ``min_rollouts`` graded rollouts is ignored (too
  noisy to count).
- The rate is **stable** when the last ``window`` counted rounds *at the current budget*
  (default 3) all lie within ``tolerance`` of each other (max - min <= 0.05 by default) and
  their mean is at least ``min_rate`` (default 0.0: a policy stuck at 0 % is "stable" only
  if you allow it; set ``min_rate`` > 0 to require progress first).
- Then the budget moves to the next one (15 -> 30) and the history starts anew: stability
  at 15 steps says nothing about 30. The last budget is kept for good. Each switch is
  recorded (:attr:`switches`: round number, old and new budget, the window's rates).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any


@dataclass
class StepCurriculum:
    budgets: Sequence[int] = (15, 30)
    window: int = 3
    tolerance: float = 0.05
    min_rate: float = 0.0
    min_rollouts: int = 1
    stage: int = 0
    rounds: int = 0
    history: list[float] = field(default_factory=list)
    switches: list[dict[str, Any]] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not self.budgets or any(b < 1 for b in self.budgets):
            raise ValueError(f"budgets must be positive step counts, not {list(self.budgets)}")
        if list(self.budgets) != sorted(self.budgets):
            raise ValueError(f"budgets must not shrink: {list(self.budgets)}")
        if self.window < 2:
            raise ValueError("window must be at least 2 rounds (one round is always 'stable')")
        if not 0.0 <= self.tolerance <= 1.0 or not 0.0 <= self.min_rate <= 1.0:
            raise ValueError("tolerance and min_rate are rates in [0, 1]")

    @property
    def budget(self) -> int:
        """The step budget of the next episodes (``Limits.max_steps``)."""
        return int(self.budgets[self.stage])

    def stable(self) -> bool:
        if len(self.history) < self.window:
            return False
        last = self.history[-self.window :]
        mean = sum(last) / len(last)
        return max(last) - min(last) <= self.tolerance + 1e-12 and mean >= self.min_rate

    def record(self, successes: int, graded: int) -> bool:
        """One round's outcome (``successes`` of ``graded`` rollouts); True when it moved the
        budget on."""
        if graded < 0 or not 0 <= successes <= graded:
            raise ValueError(f"successes {successes} of {graded} graded is not a round")
        self.rounds += 1
        if graded < self.min_rollouts:
            return False
        self.history.append(successes / graded)
        if self.stage + 1 < len(self.budgets) and self.stable():
            self.switches.append({
                "round": self.rounds, "from": self.budget,
                "to": int(self.budgets[self.stage + 1]),
                "rates": self.history[-self.window :],
            })  # fmt: skip
            self.stage += 1
            self.history = []
            return True
        return False

    def state(self) -> dict[str, Any]:
        return {
            "budget": self.budget, "stage": self.stage, "rounds": self.rounds,
            "history": list(self.history), "switches": list(self.switches),
            "rule": {"window": self.window, "tolerance": self.tolerance,
                     "min_rate": self.min_rate, "min_rollouts": self.min_rollouts},
        }  # fmt: skip
