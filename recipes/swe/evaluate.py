"""Evaluation of graded rollouts: pass@1, pass@k and best-of-N with the value-model reranker.

Input: one record per rollout, ``{"task_id", "status", "resolved", "reward", ...}`` (the
runner's ``rollouts.jsonl`` lines). ABORTED rollouts (infrastructure) and rollouts whose
grading failed on the platform (``reward`` None) are not samples: they are counted apart
(``aborted``) and never scored as failures. Per task with ``n`` graded samples of which ``c``
resolved:

- pass@k is the unbiased estimator of Chen et al. (2021), ``1 - C(n-c, k) / C(n, k)``, averaged
  over the tasks with ``n >= k`` (a task with fewer samples is left out of that k and listed
  in ``short``); pass@1 is the mean of ``c / n``.
- best-of-N: the reranker (the rewards service's ``Rank``: a value model scoring the task,
  the compact trajectory and the patch) picks one candidate per task; the figure is the share
  of tasks whose pick resolved. ``oracle`` (any resolved) and the random pick's expectation
  (= pass@1) frame it.
"""

from __future__ import annotations

import json
import math
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

Ranker = Callable[[str, list[dict[str, Any]]], Awaitable[list[tuple[str, float]]]]


def pass_at_k(n: int, c: int, k: int) -> float:
    """The unbiased pass@k estimate from ``n`` samples with ``c`` correct (needs n >= k)."""
    if k < 1 or n < k or c < 0 or c > n:
        raise ValueError(f"pass@k needs 1 <= k <= n and 0 <= c <= n (n={n}, c={c}, k={k})")
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


@dataclass
class TaskTally:
    task_id: str
    n: int = 0
    c: int = 0
    aborted: int = 0
    candidates: list[Mapping[str, Any]] = field(default_factory=list)


def tally(records: Iterable[Mapping[str, Any]]) -> dict[str, TaskTally]:
    tasks: dict[str, TaskTally] = {}
    for record in records:
        task_id = str(record["task_id"])
        t = tasks.setdefault(task_id, TaskTally(task_id))
        if record.get("status") == "aborted" or record.get("reward") is None:
            t.aborted += 1
            continue
        t.n += 1
        t.c += 1 if record.get("resolved") else 0
        t.candidates.append(record)
    return tasks


def compact_trajectory(transcript: Any, limit: int = 2000) -> list[dict[str, str]]:
    """Chat messages as ``{"role", "content"}`` text (tool calls as ``$ command``), each
    message's text cut to its head and tail: what the reranker reads."""
    out: list[dict[str, str]] = []
    for message in transcript or ():
        if not isinstance(message, Mapping):
            continue
        text = message.get("content") or ""
        if not isinstance(text, str):
            text = json.dumps(text)
        for call in message.get("tool_calls") or ():
            try:
                command = json.loads(call["function"]["arguments"]).get("command", "")
            except (ValueError, KeyError, TypeError, AttributeError):
                command = str(call)
            text += f"\n$ {command}"
        if len(text) > limit:
            text = text[: limit // 2] + "\n...\n" + text[-limit // 2 :]
        out.append({"role": str(message.get("role", "")), "content": text})
    return out


async def evaluate(
    records: Sequence[Mapping[str, Any]],
    ks: Sequence[int] = (1,),
    ranker: Ranker | None = None,
    prompts: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """The evaluation report (JSON-ready). ``ranker(task_text, candidates)`` is the rewards
    service's ``rank`` (``AsyncRewards.rank``); without one best-of-N is absent, and a ranker
    that fails is reported (``best_of_n.error``), not papered over."""
    tasks = tally(records)
    report: dict[str, Any] = {
        "tasks": len(tasks),
        "rollouts": sum(t.n + t.aborted for t in tasks.values()),
        "graded": sum(t.n for t in tasks.values()),
        "aborted": sum(t.aborted for t in tasks.values()),
        "per_task": {
            t.task_id: {"n": t.n, "resolved": t.c, "aborted": t.aborted} for t in tasks.values()
        },
    }
    graded = [t for t in tasks.values() if t.n > 0]
    report["pass@1"] = sum(t.c / t.n for t in graded) / len(graded) if graded else None
    pass_k: dict[str, Any] = {}
    for k in sorted(set(ks)):
        eligible = [t for t in graded if t.n >= k]
        pass_k[str(k)] = {
            "value": (
                sum(pass_at_k(t.n, t.c, k) for t in eligible) / len(eligible) if eligible else None
            ),
            "tasks": len(eligible),
            "short": sorted(t.task_id for t in graded if t.n < k),
        }
    report["pass@k"] = pass_k
    report["oracle"] = sum(1 for t in graded if t.c > 0) / len(graded) if graded else None
    if ranker is not None:
        report["best_of_n"] = await _best_of_n(graded, ranker, prompts or {})
    return report


async def _best_of_n(
    graded: Sequence[TaskTally], ranker: Ranker, prompts: Mapping[str, str]
) -> dict[str, Any]:
    picks: dict[str, Any] = {}
    try:
        for t in graded:
            candidates = [
                {
                    "id": str(r.get("rollout_id", i)),
                    "trajectory": compact_trajectory(r.get("transcript")),
                    "patch": str(r.get("diff") or ""),
                }
                for i, r in enumerate(t.candidates)
            ]
            ranked = await ranker(prompts.get(t.task_id, t.task_id), candidates)
            best = ranked[0][0]
            chosen = next(r for i, r in enumerate(t.candidates)
                          if str(r.get("rollout_id", i)) == best)  # fmt: skip
            picks[t.task_id] = {"rollout_id": best, "score": ranked[0][1],
                                "resolved": bool(chosen.get("resolved"))}  # fmt: skip
    except Exception as err:  # the service's refusal (no value model) or its failure, named
        return {"value": None, "error": f"{type(err).__name__}: {err}", "picks": picks}
    value = sum(1 for p in picks.values() if p["resolved"]) / len(picks) if picks else None
    return {"value": value, "picks": picks, "n": max((t.n for t in graded), default=0)}


def table(report: Mapping[str, Any]) -> str:
    """The report as a small text table."""

    def pct(value: Any) -> str:
        return "-" if value is None else f"{100 * value:.1f}%"

    lines = [
        f"tasks {report['tasks']}  rollouts {report['rollouts']}  graded {report['graded']}  "
        f"aborted {report['aborted']}",
        f"{'metric':<16}{'value':>8}  tasks",
        f"{'pass@1':<16}{pct(report['pass@1']):>8}  {report['tasks']}",
    ]
    for k, entry in report["pass@k"].items():
        if k != "1":
            lines.append(f"{'pass@' + k:<16}{pct(entry['value']):>8}  {entry['tasks']}")
    best = report.get("best_of_n")
    if best is not None:
        label = f"best-of-{best.get('n', '?')}"
        note = f"  ({best['error']})" if best.get("error") else f"  {len(best['picks'])}"
        lines.append(f"{label:<16}{pct(best['value']):>8}{note}")
    lines.append(f"{'oracle':<16}{pct(report['oracle']):>8}")
    lines.append("")
    lines.append(f"{'task':<40}{'n':>4}{'resolved':>10}{'aborted':>9}")
    for task_id, row in sorted(report["per_task"].items()):
        lines.append(f"{task_id:<40}{row['n']:>4}{row['resolved']:>10}{row['aborted']:>9}")
    return "\n".join(lines) + "\n"
