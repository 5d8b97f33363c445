"""Process reward: rubrics and weights, grid, J, reward = outcome + alpha * J, compact
rendering, the reference block, judge failure, and the anti-reward-hacking gate.
The judge is the scripted OpenAI-compatible stand-in (scripted_llm.py), not a real model."""

from __future__ import annotations

import asyncio
import json

import pytest
from orchard.rewards.judge.client import Judge, JudgeSettings
from orchard.rewards.prm.gate import gate
from orchard.rewards.prm.render import render_trajectory
from orchard.rewards.prm.rubrics import RUBRICS, WEIGHTS, snap, weighted_mean
from orchard.rewards.prm.scorer import ProcessScore, Reference, score_process

from .scripted_llm import Entry, ScriptedLLM, scripted_llm

CLEAN_PATCH = (
    "diff --git a/calc/__init__.py b/calc/__init__.py\n--- a/calc/__init__.py\n+++ b/calc/__init__.py\n"
    "@@ -1 +1 @@\n-    return sum(values) / (len(values) + 1)\n+    return sum(values) / len(values)\n"
)
TRAJECTORY = [
    {"role": "system", "content": "You are an agent."},
    {"role": "assistant", "content": "python3 -c 'from calc import mean; print(mean([2, 4]))'"},
    {"role": "tool", "content": "2.0"},
    {"role": "assistant", "content": "python3 -m pytest -rA tests"},
    {"role": "tool", "content": "collected 40 items\n" + "noise line\n" * 500
     + "PASSED tests/test_calc.py::test_add\nFAILED tests/test_calc.py::test_mean - assert 2.0 == 3\n"
     + "========= 1 failed, 39 passed in 0.10s ========="},
]  # fmt: skip


def test_weights_are_the_originals() -> None:
    assert [r.weight for r in RUBRICS] == [0.15, 0.18, 0.12, 0.15, 0.14, 0.12, 0.14]
    assert sum(WEIGHTS.values()) == pytest.approx(1.0)
    assert {r.key for r in RUBRICS if r.uses_reference} == {"R2", "R3", "R5"}


def test_grid_and_weighted_mean() -> None:
    assert snap(0.44) == pytest.approx(0.4) and snap(0.46) == pytest.approx(0.5)
    assert snap(-3) == 0.0 and snap(7) == 1.0
    scores = {k: 0.0 for k in WEIGHTS} | {"R2": 1.0}
    assert weighted_mean(scores) == pytest.approx(0.18)
    assert weighted_mean(dict.fromkeys(WEIGHTS, 1.0)) == pytest.approx(1.0)


def test_rendering_is_compact() -> None:
    text = render_trajectory(TRAJECTORY)
    assert "You are an agent" not in text  # system prompt dropped
    assert "noise line" not in text  # test output reduced to result lines
    assert "FAILED tests/test_calc.py::test_mean" in text and "1 failed, 39 passed" in text
    long = [{"role": "tool", "content": "x" * 50_000 + "THE END"}]
    rendered = render_trajectory(long)
    assert len(rendered) < 3000 and "THE END" in rendered and "chars cut" in rendered


def _score(script: list[Entry], patch: str = CLEAN_PATCH, trajectory: list[dict[str, str]] = TRAJECTORY,
           reference: Reference | None = None, outcome: float = 1.0) -> tuple[ProcessScore, ScriptedLLM]:  # fmt: skip
    with scripted_llm(script) as llm:

        async def run() -> ProcessScore:
            judge = Judge(JudgeSettings(base_url=llm.base_url, model="scripted", max_retries=0))
            try:
                return await score_process(
                    judge, "mean() is wrong", trajectory, patch, outcome, reference
                )
            finally:
                await judge.close()

        return asyncio.run(run()), llm


def test_reward_is_outcome_plus_half_j() -> None:
    raw = {"R1": 0.93, "R2": 0.8, "R3": 0.5, "R4": 0.71, "R5": 0.6, "R6": 1, "R7": 0.2}
    score, llm = _score([("ok", json.dumps({"reasoning": "ok", "scores": raw}))])
    snapped = {k: snap(v) for k, v in raw.items()}
    assert score.judged and score.scores == snapped
    assert score.j == pytest.approx(sum(WEIGHTS[k] * snapped[k] for k in WEIGHTS))
    assert score.reward == pytest.approx(1.0 + 0.5 * score.j)
    prompt = llm.requests[0]["messages"][1]["content"]
    assert "Reference" not in prompt  # none given, none shown


def test_reference_block_only_for_its_rubrics() -> None:
    good = json.dumps({"reasoning": "", "scores": dict.fromkeys(WEIGHTS, 0.5)})
    _, llm = _score(
        [("ok", good)], reference=Reference("GOLD-PATCH-TEXT", ("tests/t.py::test_mean",))
    )
    prompt = llm.requests[0]["messages"][1]["content"]
    assert "GOLD-PATCH-TEXT" in prompt and "tests/t.py::test_mean" in prompt
    assert "use ONLY for R2, R3, R5" in prompt


def test_judge_failure_is_reported_not_a_silent_zero() -> None:
    score, _ = _score([("ok", "no json at all")], outcome=-1.0)
    assert not score.judged and score.failure and score.reward == -1.0 and score.j == 0.0


@pytest.mark.parametrize(
    ("patch", "trajectory", "reason"),
    [
        ("diff --git a/tests/test_calc.py b/tests/test_calc.py\n--- a/tests/test_calc.py\n+++ b/tests/test_calc.py\n@@ -1 +1 @@\n-x\n+y\n", [], "edits test file"),
        ("diff --git a/src/conftest.py b/src/conftest.py\n+++ b/src/conftest.py\n@@ -0,0 +1 @@\n+x = 1\n", [], "edits test file"),
        (CLEAN_PATCH + "+@pytest.mark.skip(reason='flaky')\n", [], "skip/xfail"),
        (CLEAN_PATCH + "+    pytest.xfail('later')\n", [], "skip/xfail"),
        (CLEAN_PATCH + "+@unittest.skipIf(True, 'x')\n", [], "skip/xfail"),
        (CLEAN_PATCH + "+    assert True\n", [], "vacuous assertion"),
        (CLEAN_PATCH, [{"role": "assistant", "content": "rm -rf / --no-preserve-root"}], "rm -rf"),
        (CLEAN_PATCH, [{"role": "assistant", "content": "cd /testbed && git reset --hard HEAD~1"}], "git reset --hard"),
        (CLEAN_PATCH, [{"role": "assistant", "content": "git clean -fdx"}], "git clean"),
    ],
)  # fmt: skip
def test_gate_zeroes_reward_hacks(
    patch: str, trajectory: list[dict[str, str]], reason: str
) -> None:
    checked = gate(patch, trajectory)
    assert not checked.passed and any(reason in r for r in checked.reasons), checked.reasons
    score, llm = _score([("ok", "{}")], patch=patch, trajectory=trajectory, outcome=1.0)
    assert score.gated and score.reward == 0.0 and score.gate_reasons
    assert llm.requests == []  # a gated rollout costs no judge call


def test_gate_passes_honest_work() -> None:
    honest = [
        {"role": "assistant", "content": "rm -rf build/ && python3 -m pytest -rA tests"},
        {"role": "assistant", "content": "git diff; git status; git stash list"},
    ]
    assert gate(CLEAN_PATCH + "+    assert result == expected\n", honest).passed
