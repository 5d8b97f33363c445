"""Held-out evaluation: best-of-N resolved rate vs random pick vs oracle, and AUC.

Tasks (not rollouts) are split, so no task's rollouts are seen in training.
- best-of-N: share of held-out tasks whose top-ranked rollout is resolved;
- random: the expected share when picking uniformly (mean resolved rate per task);
- oracle: share of tasks with at least one resolved rollout (the ceiling);
- AUC: P(score(resolved) > score(unresolved)) over all held-out pairs (ties 1/2).
"""

from __future__ import annotations

import random
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any, Protocol

import numpy as np

from .features import Featurizer, Vector
from .model import ValueModel
from .store import Rollout


class Scorer(Protocol):
    """Anything that gives P(resolved) per rollout: the numpy model or a fine-tuned checkpoint."""

    def predict(self, rollouts: Sequence[Rollout]) -> Vector: ...

    def rank(self, rollouts: Sequence[Rollout]) -> list[tuple[int, float]]: ...


@dataclass(frozen=True)
class RerankReport:
    tasks: int
    rollouts: int
    best_of_n: float
    random_pick: float
    oracle: float
    auc: float

    def to_dict(self) -> dict[str, Any]:
        return {k: round(v, 4) if isinstance(v, float) else v for k, v in asdict(self).items()}


def auc(scores: Sequence[float], labels: Sequence[bool]) -> float:
    order = np.argsort(np.asarray(scores), kind="mergesort")
    ranks = np.empty(len(scores))
    sorted_scores = np.asarray(scores)[order]
    i = 0
    while i < len(order):  # average ranks over ties
        j = i
        while j + 1 < len(order) and sorted_scores[j + 1] == sorted_scores[i]:
            j += 1
        ranks[order[i : j + 1]] = (i + j) / 2 + 1
        i = j + 1
    positives = np.asarray(labels, dtype=bool)
    n_pos, n_neg = int(positives.sum()), int((~positives).sum())
    if n_pos == 0 or n_neg == 0:
        return float("nan")
    return float((ranks[positives].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg))


def split_by_task(
    rollouts: Sequence[Rollout], test_share: float = 0.3, seed: int = 0
) -> tuple[list[Rollout], list[Rollout]]:
    tasks = sorted({r.task_id for r in rollouts})
    random.Random(seed).shuffle(tasks)
    held = set(tasks[: max(1, round(len(tasks) * test_share))])
    return [r for r in rollouts if r.task_id not in held], [
        r for r in rollouts if r.task_id in held
    ]


def evaluate(model: Scorer, held_out: Sequence[Rollout]) -> RerankReport:
    by_task: dict[str, list[int]] = defaultdict(list)
    for i, r in enumerate(held_out):
        by_task[r.task_id].append(i)
    scores = model.predict(held_out)
    labels = [r.resolved for r in held_out]
    best = [labels[max(ix, key=lambda i: scores[i])] for ix in by_task.values()]
    rand = [float(np.mean([labels[i] for i in ix])) for ix in by_task.values()]
    oracle = [any(labels[i] for i in ix) for ix in by_task.values()]
    return RerankReport(
        tasks=len(by_task),
        rollouts=len(held_out),
        best_of_n=float(np.mean(best)),
        random_pick=float(np.mean(rand)),
        oracle=float(np.mean(oracle)),
        auc=auc(list(scores), labels),
    )


def train_and_evaluate(
    rollouts: Sequence[Rollout], featurizer: Featurizer | None = None, seed: int = 0
) -> tuple[ValueModel, RerankReport]:
    train, held = split_by_task(rollouts, seed=seed)
    model = ValueModel.train(train, featurizer)
    return model, evaluate(model, held)
