"""The GUI reward: format x LLM judge, -1 for a run of malformed outputs, no reward without a verdict.

**Format** (:func:`check_format`, per assistant turn): the turn is reasoning text followed by
exactly one tool call that :func:`orchard.recipes.gui.actions.parse_action` accepts. Reasoning
is the message's text content, or the endpoint's separate ``reasoning_content``; a
``<think>`` opened in the text must be closed, and something must be said outside or inside
it (an empty or whitespace-only turn has no reasoning). Zero calls, two or more calls, an
unknown tool or arguments the action parser refuses are malformed, each with its reason.

**Episode reward** (:func:`episode_reward`):

- ``-1.0`` when the agent stopped after ``malformed_limit`` (3) *consecutive* malformed turns
  (the agent loop stops there: ``stop_reason == "malformed"``); the judge is not asked;
- otherwise ``format x judge``: ``1.0`` when the format held and the judge says SUCCESS, else
  ``0.0``. The format holds when no turn of the episode was malformed (``strict``, the
  default: a malformed turn the agent recovered from still costs the episode its reward) or,
  with ``strict=False``, when the last turn was well formed;
- a judge that gives no verdict raises :class:`~orchard.recipes.gui.judge.JudgeFailed`: the
  runner drops the sample (the rollout is not graded and its session is finished with fault
  ``infrastructure``, so its samples are not trainable). Never a zero reward.

The judge is asked even when the format failed (the reward is then 0 whatever it says), so
every finished MiniWoB episode is a pair for the judge-agreement report; ``judge_always=False``
saves that call.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .actions import Action, BadAction, parse_action
from .judge import Episode, EpisodeJudge


@dataclass(frozen=True)
class FormatCheck:
    ok: bool
    reason: str = ""
    action: Action | None = None
    call_id: str | None = None
    reasoning: str = ""


def _reasoning(message: Mapping[str, Any]) -> tuple[str, str]:
    """(the reasoning text, what is wrong with it or "")."""
    content = message.get("content")
    if isinstance(content, list):
        content = "".join(
            str(p.get("text", ""))
            for p in content
            if isinstance(p, dict) and p.get("type") == "text"
        )
    if content is not None and not isinstance(content, str):
        return "", f"the content is a {type(content).__name__}, not text"
    text = content or ""
    if text.count("<think>") != text.count("</think>"):
        return "", "a <think> block is not closed"
    separate = message.get("reasoning_content")
    if isinstance(separate, str) and separate.strip():
        text = separate.strip() + ("\n" + text if text.strip() else "")
    bare = text.replace("<think>", "").replace("</think>", "").strip()
    if not bare:
        return "", "no reasoning before the tool call (say what you see and why you act)"
    return bare, ""


def check_format(message: Mapping[str, Any]) -> FormatCheck:
    """One assistant message: reasoning, then exactly one tool call that parses."""
    calls = message.get("tool_calls") or []
    if not isinstance(calls, list):
        return FormatCheck(False, "tool_calls is not a list")
    if len(calls) != 1:
        return FormatCheck(
            False, f"{len(calls)} tool calls: call exactly one tool per turn",
            call_id=_call_id(calls[0]) if calls else None,
        )  # fmt: skip
    call = calls[0]
    call_id = _call_id(call)
    reasoning, problem = _reasoning(message)
    if problem:
        return FormatCheck(False, problem, call_id=call_id)
    function = call.get("function") if isinstance(call, dict) else None
    if not isinstance(function, dict):
        return FormatCheck(False, "the tool call has no function", call_id=call_id)
    try:
        action = parse_action(function.get("name"), function.get("arguments"))
    except BadAction as err:
        return FormatCheck(False, err.reason, call_id=call_id, reasoning=reasoning)
    return FormatCheck(True, action=action, call_id=call_id, reasoning=reasoning)


def _call_id(call: Any) -> str | None:
    value = call.get("id") if isinstance(call, dict) else None
    return value if isinstance(value, str) else None


@dataclass(frozen=True)
class RewardRule:
    malformed_limit: int = 3
    strict: bool = True
    judge_always: bool = True
    malformed_reward: float = -1.0


async def episode_reward(
    episode: Episode,
    *,
    stop_reason: str,
    malformed_turns: int,
    last_turn_ok: bool,
    judge: EpisodeJudge,
    rule: RewardRule | None = None,
) -> tuple[float, dict[str, Any]]:
    """(the reward, how it was reached); raises ``JudgeFailed`` when the judge gives no verdict."""
    rule = rule or RewardRule()
    detail: dict[str, Any] = {
        "stop_reason": stop_reason, "malformed_turns": malformed_turns,
        "judge_success": None, "judge_reasoning": None, "judge_model": None,
    }  # fmt: skip
    if stop_reason == "malformed":
        detail.update(format_ok=False, judge_skipped="malformed_stop")
        return rule.malformed_reward, detail
    format_ok = malformed_turns == 0 if rule.strict else last_turn_ok
    detail["format_ok"] = format_ok
    if not format_ok and not rule.judge_always:
        detail["judge_skipped"] = "format_failed"
        return 0.0, detail
    verdict = await judge.judge(episode)
    detail.update(
        judge_success=verdict.success, judge_reasoning=verdict.reasoning,
        judge_model=verdict.model, judge_template=verdict.template,
        judge_attempts=verdict.attempts,
    )  # fmt: skip
    return (1.0 if format_ok and verdict.success else 0.0), detail
