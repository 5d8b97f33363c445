"""Balanced Adaptive Rollout (BAR): draw rollouts per task until a balanced group can be chosen.

GRPO-style trainers learn only from groups whose rewards differ: a group where every rollout
succeeded (or every one failed) has zero advantage everywhere and costs its rollouts for
nothing. BAR draws a task's rollouts in strides, up to a maximum, and after each stride looks
for ``group_size`` graded rollouts whose success share lies inside ``[pmin, pmax]``; of the
shares that do, it takes the one closest to the middle of the band and stops early. When the
maximum is reached without one, the group is dropped with a reason:

- ``all_success`` / ``all_failure``: every graded rollout had the same outcome (an easy task
  is instead kept with probability ``min(1, 1 - pass_rate)``: ``easy_kept``, see below);
- ``aborted``: some rollouts were aborted (infrastructure) and what was graded does not balance;
- ``unbalanced``: both outcomes were seen but no choice of ``group_size`` lands in the band
  (a narrow band such as the paper's 0.375-0.625 with one success in eight).

Aborted rollouts (``Status.ABORTED``, or no reward: never graded) are never counted as
failures. They only fill gaps: at the maximum, when fewer than ``group_size`` rollouts were
graded but those that were hold both outcomes in the band, the group is returned with the
aborted ones filling the missing places (``filled``; trainers mask them: they carry no
reward). A truncated rollout (a step, time or token limit) is graded like any other.

Easy tasks: an all-success group is kept with probability ``min(1, 1 - pass_rate)``, where
``pass_rate`` is what the caller knows of the task (a running pass rate over earlier epochs)
or, without it, this group's own (then 1: an always-solved task is dropped). Kept, it is a
zero-variance group a trainer with a baseline (or SFT) can still use; GRPO gives it no signal.

Why our own code: the rule is small and specific to the original recipe; no library ships it.
The selection (:func:`select`) is a pure function of the outcomes in draw order, so it is
tested on its own; :func:`sample_group` adds the drawing (a coroutine per rollout) around it.
"""

from __future__ import annotations

import asyncio
import enum
import random
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from orchard.rollouts import RolloutResult, Status, Task


class Outcome(enum.StrEnum):
    SUCCESS = "success"
    FAILURE = "failure"
    ABORTED = "aborted"


@dataclass(frozen=True)
class BarConfig:
    """The original's values: group 4, up to 8, stride 8, band 0.25-0.75 (the paper: 0.375-0.625)."""

    group_size: int = 4
    max_rollouts: int = 8
    stride: int = 8
    pmin: float = 0.25
    pmax: float = 0.75
    success_threshold: float = 0.0
    """A graded rollout succeeded when its reward is above this (pm1: +1 vs -1; binary: 1 vs 0)."""
    keep_easy: bool = True

    def __post_init__(self) -> None:
        if self.group_size < 2:
            raise ValueError(f"group_size must be at least 2, got {self.group_size}")
        if self.max_rollouts < self.group_size:
            raise ValueError(
                f"max_rollouts ({self.max_rollouts}) must be at least group_size ({self.group_size})"
            )
        if self.stride < 1:
            raise ValueError(f"stride must be at least 1, got {self.stride}")
        if not 0.0 <= self.pmin <= self.pmax <= 1.0:
            raise ValueError(
                f"the band must satisfy 0 <= pmin <= pmax <= 1, got [{self.pmin}, {self.pmax}]"
            )

    @property
    def middle(self) -> float:
        return (self.pmin + self.pmax) / 2


def outcome_of(result: RolloutResult, success_threshold: float = 0.0) -> Outcome:
    """ABORTED, or never graded (no reward): aborted; otherwise by the reward."""
    if result.status is Status.ABORTED or result.reward is None:
        return Outcome.ABORTED
    return Outcome.SUCCESS if result.reward > success_threshold else Outcome.FAILURE


@dataclass(frozen=True)
class Selection:
    """What :func:`select` decided: ``indices`` into the outcomes (empty when dropped)."""

    kept: bool
    reason: str
    """balanced, filled, easy_kept; or all_success, all_failure, aborted, unbalanced, pending."""
    indices: tuple[int, ...] = ()
    successes: int = 0
    """Successes among the chosen (``indices``)."""


def _in_band(share: float, config: BarConfig) -> bool:
    eps = 1e-9
    return config.pmin - eps <= share <= config.pmax + eps


def _first(outcomes: Sequence[Outcome], kind: Outcome, count: int) -> list[int]:
    return [i for i, o in enumerate(outcomes) if o is kind][:count]


def select(
    outcomes: Sequence[Outcome],
    config: BarConfig,
    *,
    final: bool,
    pass_rate: float | None = None,
    rng: random.Random | None = None,
) -> Selection:
    """Choose a group from the outcomes drawn so far (in draw order; the earliest are taken).

    ``final``: no more rollouts will be drawn (the maximum is reached), so gap filling, the
    drop rules and the easy-task rule apply; before that an unbalanced set is ``pending``.
    """
    n = config.group_size
    successes = sum(o is Outcome.SUCCESS for o in outcomes)
    failures = sum(o is Outcome.FAILURE for o in outcomes)
    aborted = len(outcomes) - successes - failures
    graded = successes + failures
    observed = successes / graded if graded else 0.0
    choices = [
        k for k in range(n + 1) if k <= successes and n - k <= failures and _in_band(k / n, config)
    ]
    if choices:
        k = min(choices, key=lambda k: (abs(k / n - config.middle), abs(k / n - observed), k))
        picked = _first(outcomes, Outcome.SUCCESS, k) + _first(outcomes, Outcome.FAILURE, n - k)
        return Selection(True, "balanced", tuple(sorted(picked)), k)
    if not final:
        return Selection(False, "pending")
    if (
        0 < graded < n
        and successes
        and failures
        and aborted >= n - graded
        and _in_band(observed, config)
    ):
        picked = [i for i, o in enumerate(outcomes) if o is not Outcome.ABORTED]
        picked += _first(outcomes, Outcome.ABORTED, n - graded)
        return Selection(True, "filled", tuple(sorted(picked)), successes)
    if successes and not failures and not aborted:
        rate = 1.0 if pass_rate is None else pass_rate
        keep_p = min(1.0, 1.0 - rate)
        if config.keep_easy and successes >= n and (rng or random).random() < keep_p:
            return Selection(True, "easy_kept", tuple(_first(outcomes, Outcome.SUCCESS, n)), n)
        return Selection(False, "all_success")
    if failures and not successes and not aborted:
        return Selection(False, "all_failure")
    if aborted:
        return Selection(False, "aborted")
    return Selection(False, "unbalanced")


@dataclass
class GroupResult:
    """One task's BAR group: the chosen rollouts, or why none; every drawn rollout is kept."""

    task_id: str
    kept: bool
    reason: str
    group: list[RolloutResult]
    """The chosen rollouts in draw order (``filled``: the aborted fillers are among them)."""
    drawn: list[RolloutResult]
    """Every rollout drawn (the rollouts spent), in draw order."""
    strides: int
    errors: list[str] = field(default_factory=list)
    """Draws that raised: recorded as aborted rollouts, the exception text here."""

    @property
    def spent(self) -> int:
        return len(self.drawn)

    def summary(self) -> dict[str, Any]:
        return {
            "task_id": self.task_id, "kept": self.kept, "reason": self.reason,
            "group": [r.session_id for r in self.group], "spent": self.spent,
            "strides": self.strides, "outcomes": [r.detail.get("bar_outcome") for r in self.drawn],
            "errors": self.errors,
        }  # fmt: skip


Draw = Callable[[Task], Awaitable[RolloutResult]]


def _aborted_result(task: Task, exc: BaseException) -> RolloutResult:
    return RolloutResult(
        task_id=task.id, harness="", status=Status.ABORTED, steps=0, diff="", transcript=None,
        samples=[], session_id=None, fault=f"the draw raised {type(exc).__name__}: {exc}",
    )  # fmt: skip


async def sample_group(
    task: Task,
    draw: Draw,
    config: BarConfig | None = None,
    *,
    pass_rate: float | None = None,
    rng: random.Random | None = None,
) -> GroupResult:
    """Draw ``task``'s rollouts in strides (each stride's draws concurrently) and choose a group.

    ``draw(task)`` runs one rollout and returns its graded :class:`RolloutResult` (reward set,
    or ``None``/``ABORTED`` for an infrastructure fault). A draw that raises counts as an
    aborted rollout (its error is in ``errors``); cancellation propagates.
    """
    config = config or BarConfig()
    drawn: list[RolloutResult] = []
    outcomes: list[Outcome] = []
    errors: list[str] = []
    strides = 0
    while True:
        count = min(config.stride, config.max_rollouts - len(drawn))
        strides += 1
        answers = await asyncio.gather(*(draw(task) for _ in range(count)), return_exceptions=True)
        for answer in answers:
            if isinstance(answer, asyncio.CancelledError):
                raise answer
            if isinstance(answer, BaseException):
                if not isinstance(answer, Exception):
                    raise answer
                errors.append(f"{type(answer).__name__}: {answer}")
                answer = _aborted_result(task, answer)
            outcome = outcome_of(answer, config.success_threshold)
            answer.detail["bar_outcome"] = outcome.value
            drawn.append(answer)
            outcomes.append(outcome)
        final = len(drawn) >= config.max_rollouts
        chosen = select(outcomes, config, final=final, pass_rate=pass_rate, rng=rng)
        if chosen.kept or final:
            group = [drawn[i] for i in chosen.indices]
            return GroupResult(task.id, chosen.kept, chosen.reason, group, drawn, strides, errors)
