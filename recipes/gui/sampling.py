"""Task sampling weighted by observed success: five buckets, each with its weight.

A task's bucket comes from the outcomes of its last ``history`` graded rollouts (success =
reward above ``success_above``; aborted and dropped rollouts are not outcomes):

=============  ==========================  =====================
bucket         success rate p              weight (the original)
=============  ==========================  =====================
``all_fail``   p == 0                      0.5
``low``        0 < p < ``low_below``       1.0
``mid``        ``low_below`` <= p <= ``high_from``  1.5
``high``       ``high_from`` < p < 1       1.0
``all_success`` p == 1                     0.5
``unseen``     no outcome yet              ``unseen_weight`` (1.5: as mid, so new tasks are tried)
=============  ==========================  =====================

(``low_below`` = 1/3 and ``high_from`` = 2/3 by default.) The weights favour tasks the
policy sometimes solves (the ones a group-relative advantage learns from) over those it
always or never solves, without starving either. Draws are from a seeded ``random.Random``,
so a run is repeatable; :meth:`SuccessSampler.sample` draws ``n`` tasks with replacement
(a task may come up twice in a round: two rollouts of it).
"""

from __future__ import annotations

import random
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

BUCKETS = ("all_fail", "low", "mid", "high", "all_success", "unseen")
DEFAULT_WEIGHTS: Mapping[str, float] = {
    "all_fail": 0.5, "low": 1.0, "mid": 1.5, "high": 1.0, "all_success": 0.5, "unseen": 1.5,
}  # fmt: skip


@dataclass
class SuccessSampler:
    task_ids: Sequence[str]
    weights: Mapping[str, float] = field(default_factory=lambda: dict(DEFAULT_WEIGHTS))
    history: int = 8
    low_below: float = 1 / 3
    high_from: float = 2 / 3
    seed: int = 0

    def __post_init__(self) -> None:
        if not self.task_ids:
            raise ValueError("no tasks to sample from")
        if len(set(self.task_ids)) != len(self.task_ids):
            raise ValueError("task ids repeat")
        unknown = set(self.weights) - set(BUCKETS)
        if unknown:
            raise ValueError(f"unknown buckets {sorted(unknown)}: the buckets are {BUCKETS}")
        self.weights = {**DEFAULT_WEIGHTS, **self.weights}
        if any(w < 0 for w in self.weights.values()):
            raise ValueError(f"weights must not be negative: {self.weights}")
        if not 0.0 < self.low_below <= self.high_from < 1.0:
            raise ValueError("need 0 < low_below <= high_from < 1")
        if self.history < 1:
            raise ValueError("history must be at least 1")
        self._outcomes: dict[str, deque[bool]] = {
            t: deque(maxlen=self.history) for t in self.task_ids
        }
        self._rng = random.Random(self.seed)

    def update(self, task_id: str, success: bool) -> None:
        """One graded outcome of ``task_id``."""
        if task_id not in self._outcomes:
            raise KeyError(f"unknown task {task_id!r}")
        self._outcomes[task_id].append(bool(success))

    def rate(self, task_id: str) -> float | None:
        seen = self._outcomes[task_id]
        return sum(seen) / len(seen) if seen else None

    def bucket(self, task_id: str) -> str:
        p = self.rate(task_id)
        if p is None:
            return "unseen"
        if p == 0.0:
            return "all_fail"
        if p == 1.0:
            return "all_success"
        if p < self.low_below:
            return "low"
        if p <= self.high_from:
            return "mid"
        return "high"

    def weight(self, task_id: str) -> float:
        return float(self.weights[self.bucket(task_id)])

    def sample(self, n: int) -> list[str]:
        """``n`` task ids drawn with replacement, each with its bucket's weight."""
        if n < 0:
            raise ValueError("n must not be negative")
        weights = [self.weight(t) for t in self.task_ids]
        if sum(weights) <= 0:
            raise ValueError("every task's bucket has weight 0: nothing can be drawn")
        return self._rng.choices(list(self.task_ids), weights=weights, k=n)

    def state(self) -> dict[str, Any]:
        buckets: dict[str, int] = dict.fromkeys(BUCKETS, 0)
        for t in self.task_ids:
            buckets[self.bucket(t)] += 1
        return {"buckets": buckets, "weights": dict(self.weights),
                "rates": {t: self.rate(t) for t in self.task_ids}}  # fmt: skip
