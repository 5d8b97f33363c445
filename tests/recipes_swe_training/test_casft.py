"""Credit-assignment SFT data: samples recorded by the real proxy, a teacher (a scripted model
that reads the trajectory it is shown) asked through the real rewards service's judge with
the SDK, records checked step by step and token by token."""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from orchard.recipes.swe import casft

from orchard import AsyncRewards

from .proxy_samples import Turn, recording_proxy, run_session
from .services import judged_rewards

GOOD = [Turn("python -m pytest -q tests", "1 failed: test_divide_by_zero"),
        Turn("cat calc/__init__.py", "def divide(a, b):\n    return a / b")]  # fmt: skip
MISTAKE = Turn("git checkout . && rm -rf tests", "")
AFTER = Turn("python -m pytest -q", "no tests ran")
TASKS = {
    "fix divide": [*GOOD, MISTAKE, AFTER],
    "fix divide (solved)": [*GOOD, Turn("apply the fix", "ok")],
    "fix divide (flat)": [*GOOD, AFTER],
    "fix divide (miscount)": [*GOOD, AFTER],
    "fix divide (garbage)": [*GOOD, AFTER],
    "fix divide (first step wrong)": [MISTAKE, *GOOD],
}


def teacher(body: dict[str, Any]) -> dict[str, Any]:
    """Reads the judge's prompt like a teacher would: the step that wipes the tests dooms the run."""
    prompt = next(
        m["content"] for m in body["messages"] if m["role"] == "user"
    )  # not a repair turn
    steps = re.split(
        r"\n\nStep \d+:\n", "\n\n" + prompt.split("Trajectory", 1)[1].split(":\n", 1)[1]
    )[1:]
    if "(garbage)" in prompt:
        return {"content": "I think it went fine overall."}
    values, level = [], 0.5
    for step in steps:
        if "rm -rf tests" in step or level < 0.1:
            level = 0.05
        elif "(flat)" not in prompt:
            level = min(1.0, level + 0.1)
        values.append(round(level, 2))
    if "(miscount)" in prompt:
        values = values[:-1]
    return {"content": json.dumps({"reasoning": "scripted", "p_start": 0.5, "p_success": values})}


@pytest.fixture(scope="module")
def samples(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[dict[str, Any]]]:
    home = tmp_path_factory.mktemp("proxy")
    with recording_proxy(home, TASKS) as proxy:
        return {task: run_session(proxy, task, turns, 1.0 if "solved" in task else -1.0)
                for task, turns in TASKS.items()}  # fmt: skip


@pytest.fixture(scope="module")
def judge(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[AsyncRewards, Any]]:
    with judged_rewards(tmp_path_factory.mktemp("rewards"), teacher) as pair:
        yield pair


def _run(coro: Any) -> Any:
    return asyncio.run(coro)


def test_failed_trajectory_trains_only_the_steps_before_the_critical_mistake(
    samples: dict[str, list[dict[str, Any]]], judge: tuple[AsyncRewards, Any], tmp_path: Path
) -> None:
    rewards, upstream = judge
    (sample,) = samples["fix divide"]
    assert sample["token_exact"] and len(sample["calls"]) == 5 and sample["reward"] == -1.0
    out = _run(casft.build([("calc-1", "fix divide", sample)], rewards))
    assert out.counts() == {"records": 1}
    (rec,) = out.records
    # the teacher saw the outcome and five numbered steps (four tool calls and the final answer)
    prompt = upstream.requests[-1]["messages"][1]["content"]
    assert (
        "Outcome: FAILED (reward -1.0)" in prompt
        and "Step 5:" in prompt
        and "Step 6:" not in prompt
    )
    assert rec["teacher"]["p_success"] == [0.6, 0.7, 0.05, 0.05, 0.05]
    assert rec["critical_step"] == 2 and rec["trained_steps"] == [0, 1]
    messages = rec["messages"]
    assistant = [i for i, m in enumerate(messages) if m["role"] == "assistant"]
    assert len(messages) == len(rec["step_loss_mask"]) == 11 and len(assistant) == 5
    assert [rec["step_loss_mask"][i] for i in assistant] == [1, 1, 0, 0, 0]
    assert all(rec["step_loss_mask"][i] == 0 for i in range(len(messages)) if i not in assistant)
    assert "rm -rf tests" in json.dumps(messages[rec["critical_message"]])
    # the token form: the engine's own tokens, only the first two completions left in the mask
    runs = _runs(sample["loss_mask"])
    kept = _runs(rec["loss_mask"])
    assert rec["tokens"] == sample["tokens"] and kept == runs[:2]
    assert "".join(chr(t) for t in rec["tokens"][kept[0][0] : kept[0][1]]).startswith("step 1")
    path = tmp_path / "casft.jsonl"
    assert casft.write_jsonl(out.records, path) == 1
    assert json.loads(path.read_text())["step_loss_mask"] == rec["step_loss_mask"]


def _runs(mask: list[int]) -> list[tuple[int, int]]:
    runs: list[tuple[int, int]] = []
    for i, m in enumerate(mask):
        if m and (i == 0 or not mask[i - 1]):
            runs.append((i, i + 1))
        elif m:
            runs[-1] = (runs[-1][0], i + 1)
    return runs


def test_what_cannot_be_credited_is_skipped_with_its_reason(
    samples: dict[str, list[dict[str, Any]]], judge: tuple[AsyncRewards, Any]
) -> None:
    rewards, _ = judge
    items = [
        (task, task, s) for task, found in samples.items() if task != "fix divide" for s in found
    ]
    out = _run(casft.build(items, rewards))
    reasons = {s.session_id: (s.reason, s.detail) for s in out.skipped}
    by_task = {
        task: reasons[found[0]["session_id"]]
        for task, found in samples.items()
        if task != "fix divide"
    }
    assert out.records == []
    assert by_task["fix divide (solved)"] == ("not_failed", "reward 1.0")
    assert by_task["fix divide (flat)"][0] == "no_critical_step"
    assert by_task["fix divide (miscount)"] == ("teacher_mismatch", "3 values for 4 steps")
    assert by_task["fix divide (garbage)"][0] == "teacher_failed"
    assert "repair" in by_task["fix divide (garbage)"][1]
    assert by_task["fix divide (first step wrong)"] == ("nothing_before_mistake", "critical step 1")


def test_an_ungraded_sample_is_not_sent_to_the_teacher(judge: tuple[AsyncRewards, Any]) -> None:
    rewards, upstream = judge
    before = len(upstream.requests)
    sample = {"session_id": "ses_x", "reward": None, "fault": "infrastructure", "trainable": False,
              "messages": [{"role": "assistant", "content": "x"}]}  # fmt: skip
    answer = _run(casft.record(sample, "task", rewards))
    assert isinstance(answer, casft.Skipped) and answer.reason == "not_graded"
    assert len(upstream.requests) == before


def test_smoothing_is_causal_and_the_drop_is_found_where_it_happened() -> None:
    smoothed = casft.smooth(0.5, [0.6, 0.7, 0.1, 0.1], 0.5)
    assert smoothed == pytest.approx([0.55, 0.625, 0.3625, 0.23125])
    credit = casft.assign(0.5, smoothed, casft.CreditConfig())
    assert credit.critical == 2 and credit.trained == (True, True, False, False)
    # a dip before the mistake is not trained on; no smoothing with alpha 1
    raw = casft.smooth(0.5, [0.6, 0.5, 0.7, 0.1], 1.0)
    credit = casft.assign(0.5, raw, casft.CreditConfig(tolerance=0.05))
    assert credit.critical == 3 and credit.trained == (True, False, True, False)
    assert casft.assign(0.5, [0.45, 0.4], casft.CreditConfig()).critical is None
    with pytest.raises(ValueError, match="alpha"):
        casft.CreditConfig(alpha=0.0)
