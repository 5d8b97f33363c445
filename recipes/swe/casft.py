"""Credit-assignment SFT data: train on the steps of a failed trajectory before its critical mistake.

A failed trajectory is not all wrong: an agent often reproduces the bug, finds the right file
and only then goes astray. For each failed trajectory a teacher model, told the outcome,
estimates after every step the probability that the task would still succeed (the rewards
service's judge with the ``step_credit@1`` template: any OpenAI-compatible model). Then:

1. **Smoothing**: an exponential moving average (``alpha``; 1.0 = none) started at the
   teacher's ``p_start``. It is causal, so a drop shows at the step that caused it, not
   spread over its neighbours as a centred window would.
2. **Critical mistake**: the step with the largest fall of the smoothed value (the earliest
   on a tie). A fall under ``min_drop`` localises nothing: the trajectory is skipped
   (``no_critical_step``), never trained on whole.
3. **Ascending segment**: the steps before the critical one whose smoothed value did not fall
   by more than ``tolerance`` are trained on (``step_loss_mask`` 1); the critical step, the
   ones after it and the falling ones before it are context only (0). A trajectory with no
   such step is skipped (``nothing_before_mistake``).

The output is one JSON object per trajectory (:func:`record` / :func:`write_jsonl`):
``messages`` (the whole conversation: everything stays for conditioning), ``step_loss_mask``
aligned with ``messages`` (0 on system, user and tool messages; 0/1 on assistant turns), the
teacher's values, the smoothed ones, the critical step, and, where the proxy's sample is
token-exact, ``tokens`` + ``loss_mask`` with the masked steps' tokens set to 0, so a trainer
can take either the message form (a chat SFT loader) or the token form (the engine's own
tokens, no re-tokenisation).

Why our own code: the procedure is the original recipe's (not public beyond the idea) and a
few lines of arithmetic; the model work is the judge's. The teacher is reached through the
public SDK (``AsyncRewards.judge``): the judge's template registry carries the prompt, its
schema check, repair round, retries, concurrency limit and cache; nothing here talks to a
model directly.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from orchard import JudgeVerdict

TEMPLATE = "step_credit@1"


@dataclass(frozen=True)
class CreditConfig:
    alpha: float = 0.5
    """EMA weight of the newest value (1.0: no smoothing)."""
    min_drop: float = 0.15
    """The smallest fall of the smoothed value that counts as the critical mistake."""
    tolerance: float = 0.05
    """A step before the mistake whose smoothed value fell by more than this is not trained on."""
    success_threshold: float = 0.0
    """A sample is failed when its reward is at or below this (pm1: -1; binary: 0)."""
    action_chars: int = 2000
    observation_chars: int = 1500

    def __post_init__(self) -> None:
        if not 0.0 < self.alpha <= 1.0:
            raise ValueError(f"alpha must be in (0, 1], got {self.alpha}")
        if self.min_drop <= 0 or self.tolerance < 0:
            raise ValueError("min_drop must be positive and tolerance not negative")


class JudgeClient(Protocol):
    """What :class:`orchard.AsyncRewards` offers (``judge(template, inputs)``)."""

    def judge(self, template: str, inputs: Mapping[str, str]) -> Awaitable[JudgeVerdict]: ...


@dataclass(frozen=True)
class Step:
    """One assistant turn (``index`` into the messages) and what it observed up to the next."""

    index: int
    action: str
    observation: str


def _text(content: Any) -> str:
    if isinstance(content, list):
        return "".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    return "" if content is None else str(content)


def _clip(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    head = limit * 2 // 3
    return f"{text[:head]}\n[... {len(text) - limit} characters cut ...]\n{text[-(limit - head) :]}"


def _action(message: Mapping[str, Any]) -> str:
    parts = [_text(message.get("content"))]
    for call in message.get("tool_calls") or ():
        if isinstance(call, Mapping):  # the Chat shape
            fn = call.get("function") or {}
            parts.append(f"[tool call {fn.get('name')}: {fn.get('arguments')}]")
        elif (
            isinstance(call, Sequence) and len(call) == 3
        ):  # the proxy's normalised [id, name, args]
            parts.append(f"[tool call {call[1]}: {call[2]}]")
    return "\n".join(p for p in parts if p)


def steps_of(messages: Sequence[Mapping[str, Any]]) -> list[Step]:
    """The assistant turns, each with the non-assistant messages that follow it."""
    steps: list[Step] = []
    for i, message in enumerate(messages):
        if message.get("role") != "assistant":
            continue
        seen = []
        for after in messages[i + 1 :]:
            if after.get("role") == "assistant":
                break
            seen.append(f"[{after.get('role')}] {_text(after.get('content'))}")
        steps.append(Step(i, _action(message), "\n".join(seen)))
    return steps


def teacher_inputs(
    task: str, outcome: str, steps: Sequence[Step], config: CreditConfig
) -> dict[str, str]:
    rendered = "\n\n".join(
        f"Step {n}:\nACTION:\n{_clip(s.action, config.action_chars)}\n"
        f"OBSERVATION:\n{_clip(s.observation, config.observation_chars) or '(none)'}"
        for n, s in enumerate(steps, 1)
    )
    return {"task": _clip(task, 6000), "outcome": outcome, "step_count": str(len(steps)),
            "steps": rendered}  # fmt: skip


def smooth(p_start: float, values: Sequence[float], alpha: float) -> list[float]:
    out, level = [], p_start
    for v in values:
        level = alpha * v + (1 - alpha) * level
        out.append(level)
    return out


@dataclass(frozen=True)
class Credit:
    critical: int | None
    """Index into the steps of the critical mistake (None: no fall reached ``min_drop``)."""
    trained: tuple[bool, ...]
    """Per step: in the ascending segment before the mistake."""


def assign(p_start: float, smoothed: Sequence[float], config: CreditConfig) -> Credit:
    levels = [p_start, *smoothed]
    drops = [levels[i] - levels[i + 1] for i in range(len(smoothed))]
    if not drops or max(drops) < config.min_drop:
        return Credit(None, tuple(False for _ in smoothed))
    critical = drops.index(max(drops))
    trained = tuple(i < critical and drops[i] <= config.tolerance for i in range(len(smoothed)))
    return Credit(critical, trained)


@dataclass
class Skipped:
    session_id: str | None
    reason: str
    detail: str = ""


@dataclass
class Outcome:
    records: list[dict[str, Any]] = field(default_factory=list)
    skipped: list[Skipped] = field(default_factory=list)

    def counts(self) -> dict[str, int]:
        out = {"records": len(self.records)}
        for s in self.skipped:
            out[s.reason] = out.get(s.reason, 0) + 1
        return out


def _token_mask(
    sample: Mapping[str, Any], assistant_indices: list[int], masked: set[int]
) -> tuple[list[int] | None, str]:
    """The sample's loss mask with the masked steps' completion tokens zeroed.

    Each completion along the proxy's branch is one run of 1s in ``loss_mask``; they are the
    branch's last ``len(calls)`` assistant turns. Anything else: no token form, and why.
    """
    if not sample.get("token_exact") or sample.get("loss_mask") is None:
        return None, "the sample is not token-exact"
    mask = [int(m) for m in sample["loss_mask"]]
    runs: list[tuple[int, int]] = []
    for i, m in enumerate(mask):
        if m and (i == 0 or not mask[i - 1]):
            runs.append((i, i))
        if m:
            runs[-1] = (runs[-1][0], i + 1)
    calls = len(sample.get("calls") or ())
    if len(runs) != calls or calls > len(assistant_indices):
        return (
            None,
            f"{len(runs)} sampled spans for {calls} calls and {len(assistant_indices)} assistant turns",
        )
    for (start, end), index in zip(runs, assistant_indices[-calls:], strict=True):
        if index in masked:
            mask[start:end] = [0] * (end - start)
    for index in assistant_indices[: len(assistant_indices) - calls]:
        if index not in masked:  # a turn in the prompt of the branch's root: no model tokens
            return (
                None,
                f"assistant turn {index} is trained but has no sampled tokens in the branch",
            )
    return mask, ""


async def record(
    sample: Mapping[str, Any],
    task: str,
    teacher: JudgeClient,
    config: CreditConfig | None = None,
    *,
    task_id: str = "",
) -> dict[str, Any] | Skipped:
    """One proxy sample (``messages``, ``reward``, optionally ``tokens``/``loss_mask``) to a record."""
    config = config or CreditConfig()
    sid = sample.get("session_id")
    reward = sample.get("reward")
    if reward is None or not sample.get("trainable", True):
        return Skipped(sid, "not_graded", f"reward {reward!r}, fault {sample.get('fault')!r}")
    if float(reward) > config.success_threshold:
        return Skipped(sid, "not_failed", f"reward {reward}")
    messages = list(sample.get("messages") or ())
    steps = steps_of(messages)
    if not steps:
        return Skipped(sid, "no_steps")
    inputs = teacher_inputs(task, f"FAILED (reward {reward})", steps, config)
    verdict = await teacher.judge(TEMPLATE, inputs)
    if not verdict.ok:
        return Skipped(sid, "teacher_failed", verdict.failure)
    try:
        values = [float(v) for v in verdict.data["p_success"]]
        p_start = float(verdict.data["p_start"])
    except (KeyError, TypeError, ValueError) as exc:
        return Skipped(sid, "teacher_malformed", f"{type(exc).__name__}: {exc}")
    if len(values) != len(steps):
        return Skipped(sid, "teacher_mismatch", f"{len(values)} values for {len(steps)} steps")
    if not all(0.0 <= v <= 1.0 for v in [p_start, *values]):
        return Skipped(sid, "teacher_malformed", "a probability outside [0, 1]")
    smoothed = smooth(p_start, values, config.alpha)
    credit = assign(p_start, smoothed, config)
    if credit.critical is None:
        return Skipped(sid, "no_critical_step", f"largest fall under {config.min_drop}")
    if not any(credit.trained):
        return Skipped(sid, "nothing_before_mistake", f"critical step {credit.critical + 1}")
    trained_messages = {s.index for s, t in zip(steps, credit.trained, strict=True) if t}
    step_loss_mask = [int(i in trained_messages) for i in range(len(messages))]
    assistant = [s.index for s in steps]
    tokens_mask, why = _token_mask(sample, assistant, set(assistant) - trained_messages)
    out: dict[str, Any] = {
        "session_id": sid, "task_id": task_id, "reward": reward,
        "messages": messages, "step_loss_mask": step_loss_mask,
        "teacher": {"template": TEMPLATE, "p_start": p_start, "p_success": values,
                    "reasoning": verdict.data.get("reasoning", "")},
        "smoothed": [round(v, 6) for v in smoothed],
        "critical_step": credit.critical, "critical_message": steps[credit.critical].index,
        "trained_steps": [i for i, t in enumerate(credit.trained) if t],
    }  # fmt: skip
    if tokens_mask is not None:
        out.update(tokens=list(sample["tokens"]), loss_mask=tokens_mask,
                   prompt_length=sample.get("prompt_length"))  # fmt: skip
    else:
        out["no_token_form"] = why
    return out


async def build(
    items: Iterable[tuple[str, str, Mapping[str, Any]]],
    teacher: JudgeClient,
    config: CreditConfig | None = None,
) -> Outcome:
    """``items``: (task id, task prompt, proxy sample). Records and skips, nothing dropped silently."""
    outcome = Outcome()
    for task_id, task, sample in items:
        answer = await record(sample, task, teacher, config, task_id=task_id)
        if isinstance(answer, Skipped):
            outcome.skipped.append(answer)
        else:
            outcome.records.append(answer)
    return outcome


def write_jsonl(records: Iterable[Mapping[str, Any]], path: Path) -> int:
    n = 0
    with path.open("w", encoding="utf-8") as out:
        for r in records:
            out.write(json.dumps(r, ensure_ascii=False) + "\n")
            n += 1
    return n
