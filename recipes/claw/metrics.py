"""Claw-Eval's metrics over graded trials: pass^k, pass@k and mean score, per harness, per task
category and overall, as JSON and as a text or Markdown table.

Per task, from its ``n`` counted trials of which ``c`` passed (score >= 0.75):

- **pass^k** (all k trials pass): with exactly ``n == k`` trials, 1 if all passed else 0;
  with ``n > k`` the unbiased estimator of "k trials drawn without replacement all pass",
  ``C(c, k) / C(n, k)`` (tau-bench's pass^k);
- **pass@k** (at least one of k passes): with ``n == k``, 1 if any passed else 0; with
  ``n > k`` the unbiased estimator ``1 - C(n - c, k) / C(n, k)`` (Chen et al., 2021);
- **mean score**: the mean of its trials' scores.

A group's figure (a category, or all tasks) is the mean over its tasks (each task weighs the
same, however many trials it had). **ABORTED trials are infrastructure faults: they are not
counted** (neither as a pass nor as a fail); they are reported on their own (``aborted``),
and a task with fewer than ``k`` counted trials is left out of pass^k and pass@k (listed in
``short``) rather than scored on fewer trials. Its mean score still counts.

Why our own: the estimators are two lines of arithmetic, and the grouping (per harness, per
category, aborted apart) is this recipe's; no package does both.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

OVERALL = "all"


@dataclass(frozen=True)
class TrialOutcome:
    """One trial as the metrics see it: ``score`` None for an ABORTED trial."""

    task_id: str
    category: str
    harness: str
    score: float | None
    passed: bool = False

    @property
    def aborted(self) -> bool:
        return self.score is None


def pass_hat_k(n: int, c: int, k: int) -> float:
    """pass^k of a task with ``n`` trials, ``c`` passed: ``C(c, k) / C(n, k)``."""
    _check(n, c, k)
    return math.comb(c, k) / math.comb(n, k)


def pass_at_k(n: int, c: int, k: int) -> float:
    """pass@k of a task with ``n`` trials, ``c`` passed: ``1 - C(n - c, k) / C(n, k)``."""
    _check(n, c, k)
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def _check(n: int, c: int, k: int) -> None:
    if k < 1:
        raise ValueError(f"k must be at least 1, not {k}")
    if not 0 <= c <= n:
        raise ValueError(f"passed trials {c} must be within 0..{n}")
    if n < k:
        raise ValueError(f"{n} trials are fewer than k = {k}")


@dataclass
class TaskStats:
    task_id: str
    category: str
    trials: int
    passed: int
    aborted: int
    mean_score: float | None
    pass_hat_k: float | None
    pass_at_k: float | None


@dataclass
class GroupStats:
    """A category's (or all tasks') figures; ``short``: tasks with fewer than k trials."""

    tasks: int
    trials: int
    aborted: int
    pass_hat_k: float | None
    pass_at_k: float | None
    mean_score: float | None
    short: list[str] = field(default_factory=list)


@dataclass
class HarnessReport:
    harness: str
    overall: GroupStats
    categories: dict[str, GroupStats]
    tasks: list[TaskStats]


@dataclass
class Report:
    k: int
    estimator: str
    harnesses: list[HarnessReport]

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def _mean(values: Sequence[float]) -> float | None:
    return round(sum(values) / len(values), 6) if values else None


def task_stats(outcomes: Sequence[TrialOutcome], k: int) -> TaskStats:
    """One task's figures from its trials (one harness)."""
    counted = [o for o in outcomes if not o.aborted]
    n, c = len(counted), sum(o.passed for o in counted)
    scores = [o.score for o in counted if o.score is not None]
    enough = n >= k
    return TaskStats(
        task_id=outcomes[0].task_id,
        category=outcomes[0].category,
        trials=n,
        passed=c,
        aborted=len(outcomes) - n,
        mean_score=_mean(scores),
        pass_hat_k=round(pass_hat_k(n, c, k), 6) if enough else None,
        pass_at_k=round(pass_at_k(n, c, k), 6) if enough else None,
    )


def group_stats(tasks: Sequence[TaskStats]) -> GroupStats:
    scored = [t for t in tasks if t.pass_hat_k is not None]
    return GroupStats(
        tasks=len(tasks),
        trials=sum(t.trials for t in tasks),
        aborted=sum(t.aborted for t in tasks),
        pass_hat_k=_mean([t.pass_hat_k for t in scored if t.pass_hat_k is not None]),
        pass_at_k=_mean([t.pass_at_k for t in scored if t.pass_at_k is not None]),
        mean_score=_mean([t.mean_score for t in tasks if t.mean_score is not None]),
        short=sorted(t.task_id for t in tasks if t.pass_hat_k is None),
    )


def summarize(outcomes: Iterable[TrialOutcome], k: int = 3) -> Report:
    """The report over every trial: per harness (in order of first appearance), per category
    (sorted) and overall."""
    if k < 1:
        raise ValueError(f"k must be at least 1, not {k}")
    by_harness: dict[str, dict[str, list[TrialOutcome]]] = {}
    categories: dict[str, str] = {}
    for o in outcomes:
        known = categories.setdefault(o.task_id, o.category)
        if known != o.category:
            raise ValueError(f"task {o.task_id} is in two categories: {known!r}, {o.category!r}")
        by_harness.setdefault(o.harness, {}).setdefault(o.task_id, []).append(o)
    reports = []
    for harness, per_task in by_harness.items():
        stats = [task_stats(trials, k) for trials in per_task.values()]
        cats: dict[str, list[TaskStats]] = {}
        for s in stats:
            cats.setdefault(s.category, []).append(s)
        reports.append(
            HarnessReport(
                harness=harness,
                overall=group_stats(stats),
                categories={name: group_stats(cats[name]) for name in sorted(cats)},
                tasks=sorted(stats, key=lambda s: s.task_id),
            )
        )
    estimator = (
        f"per task: with n == {k} counted trials, pass^{k} = all pass, pass@{k} = any passes; "
        f"with n > {k} the unbiased estimators C(c,{k})/C(n,{k}) and 1 - C(n-c,{k})/C(n,{k}); "
        "groups: the mean over tasks; aborted trials not counted"
    )
    return Report(k=k, estimator=estimator, harnesses=reports)


def _cell(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def rows(report: Report) -> list[list[str]]:
    """The table's rows: harness, category, tasks, trials, aborted, pass^k, pass@k, mean."""
    out = []
    for h in report.harnesses:
        groups = [*h.categories.items(), (OVERALL, h.overall)]
        for name, g in groups:
            out.append(
                [
                    h.harness,
                    name,
                    str(g.tasks),
                    str(g.trials),
                    str(g.aborted),
                    _cell(g.pass_hat_k),
                    _cell(g.pass_at_k),
                    _cell(g.mean_score),
                ]
            )
    return out


def header(k: int) -> list[str]:
    return ["harness", "category", "tasks", "trials", "aborted", f"pass^{k}", f"pass@{k}", "mean"]


def markdown_table(report: Report) -> str:
    head = header(report.k)
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(r) + " |" for r in rows(report)]
    return "\n".join(lines) + "\n"


def text_table(report: Report) -> str:
    table = [header(report.k), *rows(report)]
    widths = [max(len(r[i]) for r in table) for i in range(len(table[0]))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(r, widths, strict=True)) for r in table]
    short = [
        f"{h.harness}: fewer than {report.k} counted trials (left out of pass^k/pass@k): "
        + ", ".join(h.overall.short)
        for h in report.harnesses
        if h.overall.short
    ]
    return "\n".join(line.rstrip() for line in lines + short) + "\n"
