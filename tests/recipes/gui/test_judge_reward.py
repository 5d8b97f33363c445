"""The format check, the episode reward rule and the image judge, against a scripted judge
(``orchard.testing.scripted_model``: a real HTTP server on loopback following a policy)."""

from __future__ import annotations

import asyncio
import base64
import json
from typing import Any

import pytest
from orchard.recipes.gui.actions import Click, Done
from orchard.recipes.gui.judge import (
    ChatJudge,
    Episode,
    JudgeFailed,
    Step,
    read_verdict,
    user_content,
)
from orchard.recipes.gui.reward import RewardRule, check_format, episode_reward

from orchard.testing.scripted_model import scripted_upstream

PNG = b"\x89PNG\r\n\x1a\n" + b"\x00" * 16


def _call(name: str, arguments: str, call_id: str = "c1") -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def _message(content: Any, *calls: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {"role": "assistant", "content": content, "tool_calls": list(calls) or None, **extra}


def test_a_well_formed_turn_is_reasoning_then_one_call_that_parses() -> None:
    check = check_format(
        _message("The button is at the top.", _call("click", '{"x": 0.5, "y": 0.1}'))
    )
    assert check.ok and check.action == Click(0.5, 0.1) and check.call_id == "c1"
    assert check.reasoning == "The button is at the top."
    think = check_format(_message("<think>It is done.</think>", _call("done", "{}")))
    assert think.ok and think.action == Done("")
    separate = check_format(_message(None, _call("done", "{}"), reasoning_content="All set."))
    assert separate.ok and separate.reasoning == "All set."


@pytest.mark.parametrize(
    ("message", "says"),
    [
        (_message("just text"), "0 tool calls"),
        (_message("two", _call("done", "{}"), _call("done", "{}", "c2")), "2 tool calls"),
        (_message("", _call("done", "{}")), "no reasoning"),
        (_message("  <think> </think> ", _call("done", "{}")), "no reasoning"),
        (_message("<think>unclosed", _call("done", "{}")), "not closed"),
        (_message("go", _call("fly", "{}")), "unknown tool"),
        (_message("go", _call("click", '{"x": 2, "y": 0}')), "outside the screen"),
        (_message("go", _call("click", "{not json")), "not valid JSON"),
        (_message(["not", "parts"], _call("done", "{}")), "no reasoning"),
        (_message(7, _call("done", "{}")), "not text"),
    ],
)
def test_malformed_turns_say_why(message: dict[str, Any], says: str) -> None:
    check = check_format(message)
    assert not check.ok and says in check.reason, check.reason


def _episode(shots: int = 3) -> Episode:
    steps = [Step("I see the button.", "click(x=0.5, y=0.1)"), Step("Done.", "done(answer='')")]
    return Episode("Click the button.", steps, "", "done", [(i, PNG) for i in range(shots)])


def test_the_prompt_shows_task_history_answer_and_the_last_screenshots() -> None:
    parts = user_content(_episode())
    text = parts[0]["text"]
    assert (
        "Task:\nClick the button." in text
        and "1. I see the button.\n   -> click(x=0.5, y=0.1)" in text
    )
    assert "Final answer: ''" in text and "The last 3 screenshot(s) follow" in text
    images = [p for p in parts if p["type"] == "image_url"]
    assert [p["image_url"]["url"] for p in images] == [
        "data:image/png;base64," + base64.b64encode(PNG).decode()
    ] * 3
    none = user_content(Episode("t", [], None, "max_steps"))[0]["text"]
    assert "Final answer: none (the episode ended by max_steps)" in none and "(none)" in none


def test_verdicts_are_read_strictly() -> None:
    assert read_verdict('{"reasoning": "ok", "verdict": "SUCCESS"}') == (True, "ok")
    assert read_verdict('```json\n{"verdict": "failure"}\n```') == (False, "")
    assert read_verdict("Looks good to me") == "not JSON (Expecting value)"
    assert str(read_verdict('{"verdict": "maybe"}')).startswith('no "verdict"')


def _judge(url: str, **kw: Any) -> ChatJudge:
    return ChatJudge(url, "judge", backoff_seconds=0.01, **kw)


async def _ask(judge: ChatJudge, episode: Episode) -> Any:
    try:
        return await judge.judge(episode)
    finally:
        await judge.aclose()


def test_the_judge_sees_the_images_and_answers() -> None:
    def policy(body: dict[str, Any]) -> dict[str, Any]:
        parts = body["messages"][1]["content"]
        shown = sum(1 for p in parts if p["type"] == "image_url")
        verdict = "SUCCESS" if shown == 3 else "FAILURE"
        return {"content": json.dumps({"reasoning": f"{shown} screenshots", "verdict": verdict})}

    with scripted_upstream(policy) as (upstream, url):
        verdict = asyncio.run(_ask(_judge(url), _episode()))
    assert (verdict.success, verdict.reasoning, verdict.model, verdict.template) == (
        True, "3 screenshots", "judge", "gui_episode@1",
    )  # fmt: skip
    (body,) = upstream.requests
    assert body["model"] == "judge" and body["messages"][0]["role"] == "system"


def test_a_malformed_verdict_gets_one_repair_then_fails() -> None:
    with scripted_upstream([{"content": "yes!"}, {"content": '{"verdict": "SUCCESS"}'}]) as (
        up,
        url,
    ):
        verdict = asyncio.run(_ask(_judge(url), _episode()))
    assert verdict.success and verdict.attempts == 2
    assert "Your reply was not valid: not JSON" in up.requests[1]["messages"][-1]["content"]
    with (
        scripted_upstream([{"content": "yes!"}, {"content": "still prose"}]) as (_, url),
        pytest.raises(JudgeFailed, match="malformed verdict after one repair"),
    ):
        asyncio.run(_ask(_judge(url), _episode()))


def test_transient_errors_are_retried_and_hard_ones_fail() -> None:
    ok = {"content": '{"reasoning": "", "verdict": "FAILURE"}'}
    with scripted_upstream([{"status": 503}, {"status": 429}, ok]) as (up, url):
        assert not asyncio.run(_ask(_judge(url), _episode())).success
    assert len(up.requests) == 3
    with (
        scripted_upstream([{"status": 503}] * 3) as (_, url),
        pytest.raises(JudgeFailed, match="after 3 tries"),
    ):
        asyncio.run(_ask(_judge(url), _episode()))
    with (
        scripted_upstream([{"status": 400}]) as (_, url),
        pytest.raises(JudgeFailed, match="answered 400"),
    ):
        asyncio.run(_ask(_judge(url), _episode()))
    with pytest.raises(JudgeFailed, match="unreachable"):
        asyncio.run(_ask(_judge("http://127.0.0.1:9/v1", retries=0), _episode()))


def _reward(url: str, **kw: Any) -> tuple[float, dict[str, Any]]:
    async def go() -> tuple[float, dict[str, Any]]:
        judge = _judge(url)
        try:
            return await episode_reward(_episode(), judge=judge, **kw)
        finally:
            await judge.aclose()

    return asyncio.run(go())


def test_reward_is_format_times_judge() -> None:
    yes = {"content": '{"reasoning": "done", "verdict": "SUCCESS"}'}
    no = {"content": '{"reasoning": "not done", "verdict": "FAILURE"}'}
    with scripted_upstream([yes, no, yes, yes]) as (up, url):
        ok = dict(stop_reason="done", malformed_turns=0, last_turn_ok=True)
        assert _reward(url, **ok)[0] == 1.0
        assert _reward(url, **ok)[0] == 0.0
        # one malformed turn the agent recovered from: strict format fails, the judge is
        # still asked (for the agreement report), the reward is 0
        reward, detail = _reward(url, stop_reason="done", malformed_turns=1, last_turn_ok=True)
        assert (reward, detail["format_ok"], detail["judge_success"]) == (0.0, False, True)
        lenient = RewardRule(strict=False)
        assert (
            _reward(url, stop_reason="done", malformed_turns=1, last_turn_ok=True, rule=lenient)[0]
            == 1.0
        )
    assert len(up.requests) == 4


def test_three_malformed_in_a_row_is_minus_one_without_asking_the_judge() -> None:
    with scripted_upstream([]) as (up, url):
        reward, detail = _reward(
            url, stop_reason="malformed", malformed_turns=3, last_turn_ok=False
        )
        assert (reward, detail["judge_skipped"]) == (-1.0, "malformed_stop")
        skip = RewardRule(judge_always=False)
        reward, detail = _reward(
            url, stop_reason="done", malformed_turns=2, last_turn_ok=True, rule=skip
        )
        assert (reward, detail["judge_skipped"]) == (0.0, "format_failed")
    assert up.requests == []


def test_a_judge_failure_raises_never_a_zero() -> None:
    with scripted_upstream([{"status": 500}] * 3) as (_, url), pytest.raises(JudgeFailed):
        _reward(url, stop_reason="done", malformed_turns=0, last_turn_ok=True)
