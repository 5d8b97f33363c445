"""The LLM judge against a scripted OpenAI-compatible server on loopback.

The server is a stand-in for a real model (see scripted_llm.py): real HTTP,
real ``openai`` client, scripted answers. The real-model run is the opt-in
``make test-llm`` (test_judge_real_model.py).
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import replace

import orchard.rewards.prm.scorer  # noqa: F401 (registers the prm_rubrics template)
from orchard.rewards.judge.client import Judge, JudgeSettings, Verdict
from orchard.rewards.judge.templates import PATCH_VERDICT, get_template

from .scripted_llm import Entry, ScriptedLLM, scripted_llm

GOOD = json.dumps({"reasoning": "fine", "verdict": "correct", "score": 0.9})
INPUTS = {"task": "fix mean()", "patch": "diff --git a/x b/x"}


def _settings(llm: ScriptedLLM, **kw: object) -> JudgeSettings:
    base = JudgeSettings(base_url=llm.base_url, model="scripted", api_key="k", timeout_seconds=2.0,
                         max_retries=3, backoff_base_seconds=0.01, backoff_max_seconds=0.05)  # fmt: skip
    return replace(base, **kw)  # type: ignore[arg-type]


def _judge_once(script: list[Entry], **kw: object) -> tuple[Verdict, ScriptedLLM]:
    with scripted_llm(script) as llm:

        async def run() -> Verdict:
            judge = Judge(_settings(llm, **kw))
            try:
                return await judge.judge(PATCH_VERDICT, INPUTS)
            finally:
                await judge.close()

        return asyncio.run(run()), llm


def test_good_verdict_and_prompt() -> None:
    verdict, llm = _judge_once([("ok", GOOD)])
    assert verdict.ok and verdict.data["verdict"] == "correct" and verdict.attempts == 1
    messages = llm.requests[0]["messages"]
    assert messages[0]["role"] == "system" and "fix mean()" in messages[1]["content"]
    assert llm.requests[0]["model"] == "scripted"


def test_fenced_json_in_prose_is_accepted() -> None:
    verdict, _ = _judge_once([("ok", f"Sure!\n```json\n{GOOD}\n```")])
    assert verdict.ok and verdict.data["score"] == 0.9


def test_malformed_then_repaired() -> None:
    verdict, llm = _judge_once([("ok", "I think it is correct."), ("ok", GOOD)])
    assert verdict.ok and verdict.attempts == 2
    repair = llm.requests[1]["messages"]
    assert repair[-2] == {"role": "assistant", "content": "I think it is correct."}
    assert "not valid" in repair[-1]["content"]


def test_schema_violation_twice_is_no_verdict() -> None:
    bad = json.dumps({"reasoning": "x", "verdict": "maybe", "score": 7})
    verdict, llm = _judge_once([("ok", bad)])
    assert not verdict.ok and "malformed verdict after one repair" in verdict.failure
    assert "maximum" in verdict.failure and len(llm.requests) == 2  # exactly one repair


def test_429_and_500_are_retried() -> None:
    verdict, llm = _judge_once([("status", 429), ("status", 500), ("ok", GOOD)])
    assert verdict.ok and len(llm.requests) == 3


def test_persistent_500_is_no_verdict_after_retries() -> None:
    verdict, llm = _judge_once([("status", 500)], max_retries=2)
    assert not verdict.ok and "InternalServerError" in verdict.failure
    assert len(llm.requests) == 3  # first try + 2 retries


def test_400_is_not_retried() -> None:
    verdict, llm = _judge_once([("status", 400)])
    assert not verdict.ok and len(llm.requests) == 1


def test_slow_answer_times_out_then_retries() -> None:
    verdict, llm = _judge_once([("slow", 1.5, GOOD), ("ok", GOOD)], timeout_seconds=0.5)
    assert verdict.ok and len(llm.requests) == 2


def test_unconfigured_judge_is_no_verdict() -> None:
    async def run() -> Verdict:
        return await Judge(JudgeSettings(base_url="", model="")).judge(PATCH_VERDICT, INPUTS)

    verdict = asyncio.run(run())
    assert not verdict.ok and "ORCHARD_JUDGE_BASE_URL" in verdict.failure


def test_missing_input_is_no_verdict() -> None:
    async def run() -> Verdict:
        return await Judge(JudgeSettings(base_url="http://127.0.0.1:9/v1", model="m")).judge(
            PATCH_VERDICT, {"task": "t"}
        )

    missing = asyncio.run(run())
    assert not missing.ok and "patch" in missing.failure


def test_cache_by_template_version_model_and_inputs() -> None:
    with scripted_llm([("ok", GOOD)]) as llm:

        async def run() -> list[Verdict]:
            judge = Judge(_settings(llm))
            other_model = Judge(_settings(llm, model="other"), cache=judge.cache)
            v2 = replace(PATCH_VERDICT, version="2")
            out = [
                await judge.judge(PATCH_VERDICT, INPUTS),
                await judge.judge(PATCH_VERDICT, dict(reversed(list(INPUTS.items())))),
                await judge.judge(v2, INPUTS),
                await other_model.judge(PATCH_VERDICT, INPUTS),
                await judge.judge(PATCH_VERDICT, {**INPUTS, "patch": "other"}),
            ]
            await judge.close()
            await other_model.close()
            return out

        verdicts = asyncio.run(run())
        assert [v.cached for v in verdicts] == [False, True, False, False, False]
        assert len(llm.requests) == 4


def test_failures_are_not_cached() -> None:
    with scripted_llm([("status", 400), ("ok", GOOD)]) as llm:

        async def run() -> list[Verdict]:
            judge = Judge(_settings(llm))
            out = [
                await judge.judge(PATCH_VERDICT, INPUTS),
                await judge.judge(PATCH_VERDICT, INPUTS),
            ]
            await judge.close()
            return out

        first, second = asyncio.run(run())
        assert not first.ok and second.ok and not second.cached


def test_concurrency_limit_holds() -> None:
    with scripted_llm([("slow", 0.2, GOOD)]) as llm:

        async def run() -> list[Verdict]:
            judge = Judge(_settings(llm, max_concurrency=3))
            out = await asyncio.gather(
                *(judge.judge(PATCH_VERDICT, {**INPUTS, "patch": str(i)}) for i in range(9))
            )
            await judge.close()
            return list(out)

        verdicts = asyncio.run(run())
        assert all(v.ok for v in verdicts)
        assert llm.max_in_flight == 3


def test_templates_are_versioned() -> None:
    assert get_template("patch_verdict") is PATCH_VERDICT
    assert get_template("patch_verdict@1") is PATCH_VERDICT
    assert get_template("prm_rubrics").version == "2"  # v2: the static gate findings
