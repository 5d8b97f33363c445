"""pass@k against brute force over every k-subset, the report's bookkeeping (aborted rollouts
apart), and best-of-N's pick. The ranker here is a plain function (the real one, the rewards
service's value model, is exercised in test_swe_live.py)."""

from __future__ import annotations

import asyncio
import itertools
import math
from typing import Any

import pytest
from orchard.recipes.swe.evaluate import compact_trajectory, evaluate, pass_at_k, table


@pytest.mark.parametrize("n", range(1, 8))
def test_pass_at_k_is_the_share_of_k_subsets_with_a_success(n: int) -> None:
    for c in range(n + 1):
        outcomes = [True] * c + [False] * (n - c)
        for k in range(1, n + 1):
            subsets = list(itertools.combinations(outcomes, k))
            exact = sum(1 for s in subsets if any(s)) / len(subsets)
            assert math.isclose(pass_at_k(n, c, k), exact), (n, c, k)


def test_pass_at_k_refuses_impossible_counts() -> None:
    for n, c, k in [(2, 3, 1), (2, 1, 3), (2, 1, 0), (3, -1, 1)]:
        with pytest.raises(ValueError):
            pass_at_k(n, c, k)


def rec(task: str, i: int, resolved: bool, status: str = "completed", **kw: Any) -> dict[str, Any]:
    return {"task_id": task, "rollout_id": f"{task}#{i}", "status": status,
            "resolved": resolved, "reward": 1.0 if resolved else -1.0,
            "diff": f"patch {task} {i}", "transcript": [], **kw}  # fmt: skip


def test_the_report_keeps_aborted_and_ungradable_rollouts_apart() -> None:
    records = [
        rec("a", 0, True), rec("a", 1, False), rec("a", 2, False), rec("a", 3, True),
        rec("b", 0, False), rec("b", 1, False, status="aborted", reward=None),
        rec("b", 2, False, reward=None),  # graded by nobody: the platform failed
        rec("c", 0, True, status="truncated"),
    ]  # fmt: skip
    report = asyncio.run(evaluate(records, ks=(1, 2, 4)))
    assert report["rollouts"] == 8 and report["graded"] == 6 and report["aborted"] == 2
    assert report["per_task"]["b"] == {"n": 1, "resolved": 0, "aborted": 2}
    assert math.isclose(report["pass@1"], (0.5 + 0.0 + 1.0) / 3)
    assert report["pass@k"]["2"]["tasks"] == 1 and report["pass@k"]["2"]["short"] == ["b", "c"]
    assert math.isclose(report["pass@k"]["2"]["value"], pass_at_k(4, 2, 2))
    assert report["pass@k"]["4"]["value"] == 1.0
    assert math.isclose(report["oracle"], 2 / 3)
    assert "best_of_n" not in report
    text = table(report)
    assert "pass@2             83.3%  1" in text and "pass@1             50.0%  3" in text


def test_best_of_n_takes_the_rankers_pick_and_reports_its_failure() -> None:
    records = [rec("a", 0, False), rec("a", 1, True), rec("b", 0, False), rec("b", 1, False)]
    asked: list[tuple[str, list[dict[str, Any]]]] = []

    async def by_last_digit(task: str, candidates: list[dict[str, Any]]) -> list[tuple[str, float]]:
        asked.append((task, candidates))
        scored = [(c["id"], float(c["patch"][-1])) for c in candidates]
        return sorted(scored, key=lambda s: -s[1])

    report = asyncio.run(evaluate(records, ranker=by_last_digit, prompts={"a": "fix a"}))
    assert report["best_of_n"]["value"] == 0.5
    assert report["best_of_n"]["picks"]["a"] == {
        "rollout_id": "a#1",
        "score": 1.0,
        "resolved": True,
    }
    assert asked[0][0] == "fix a" and asked[1][0] == "b"
    assert "best-of-2" in table(report)

    async def refuses(task: str, candidates: list[dict[str, Any]]) -> list[tuple[str, float]]:
        raise RuntimeError("no value model loaded")

    failed = asyncio.run(evaluate(records, ranker=refuses))["best_of_n"]
    assert failed["value"] is None and "no value model loaded" in failed["error"]


def test_the_compact_trajectory_renders_tool_calls_and_cuts_long_text() -> None:
    transcript = [
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "1", "type": "function",
             "function": {"name": "bash", "arguments": '{"command": "pytest -q"}'}}]},
        {"role": "tool", "tool_call_id": "1", "content": "x" * 5000},
    ]  # fmt: skip
    compact = compact_trajectory(transcript, limit=100)
    assert compact[0] == {"role": "assistant", "content": "\n$ pytest -q"}
    assert len(compact[1]["content"]) == 105 and "\n...\n" in compact[1]["content"]
