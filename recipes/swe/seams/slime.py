"""slime: a custom generate function, a reward function and a dynamic-sampling filter.

slime (THUDM/slime, installed from git only; not on PyPI) loads these by import path:

- ``--custom-generate-function-path``: ``async def generate(args, sample, sampling_params)
  -> Sample | list[Sample]``; the function fills the sample it is given: ``tokens`` (prompt +
  response ids), ``response_length``, ``loss_mask`` and ``rollout_log_probs`` (both over the
  response only), ``reward``, ``status`` (``Sample.Status``: COMPLETED / TRUNCATED / ABORTED),
  ``metadata``; ``teacher_log_probs`` (response only) for on-policy distillation. A rollout
  whose proxy session has several branches returns one Sample per branch (slime's fan-out).
- ``--custom-rm-path``: ``async def reward(args, sample) -> float``;
- ``--dynamic-sampling-filter-path``: ``def filter(args, samples, **kwargs) ->
  DynamicFilterOutput(keep, reason)`` on one prompt's group.

Read from slime's repository (``slime/utils/types.py`` for ``Sample``,
``slime/rollout/filter_hub/`` for the filter output); these functions touch only those
attributes, so they work on slime's own ``Sample`` and are tested on a stand-in with its
fields. ``DynamicFilterOutput`` is slime's own class when slime is importable: slime treats
any other return value as a legacy bool, and an object is always true.

Wiring: slime calls a module-level function, so a training script builds them once::

    # my_slime_hooks.py
    from orchard.recipes.swe.seams import slime as seam
    generate = seam.make_generate(draw=my_draw, task_of=my_task_of)   # draw(task) -> RolloutResult
    reward = seam.reward
    bar_filter = seam.bar_filter

    --custom-generate-function-path my_slime_hooks.generate --custom-rm-path my_slime_hooks.reward
    --dynamic-sampling-filter-path my_slime_hooks.bar_filter
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from orchard.rollouts import RolloutResult, Status, Task

from ..bar import BarConfig, outcome_of, select
from .common import SampleError, split, trainable_samples

Draw = Callable[[Task], Awaitable[RolloutResult]]


def _status(sample: Any, status: Status) -> Any:
    statuses = type(sample).Status
    return {Status.COMPLETED: statuses.COMPLETED, Status.TRUNCATED: statuses.TRUNCATED,
            Status.ABORTED: statuses.ABORTED}[status]  # fmt: skip


def fill(sample: Any, result: RolloutResult, proxy_sample: dict[str, Any] | None) -> Any:
    """Write one branch of a rollout into a slime ``Sample`` (in place) and return it."""
    sample.status = _status(sample, result.status)
    sample.metadata = {**(sample.metadata or {}), "orchard": {
        "task_id": result.task_id, "session_id": result.session_id, "status": result.status.value,
        "fault": result.fault, "steps": result.steps, "diff": result.diff,
        "outcome_reward": result.detail.get("outcome_reward", result.reward),
    }}  # fmt: skip
    if proxy_sample is None:  # aborted / ungraded: nothing to train on, slime drops it
        sample.reward = None
        sample.remove_sample = True
        return sample
    part = split(proxy_sample)
    sample.tokens = part.prompt_ids + part.response_ids
    sample.response_length = len(part.response_ids)
    sample.loss_mask = part.response_mask
    sample.rollout_log_probs = part.response_logprobs
    sample.reward = part.reward
    sample.response = result.submission or ""
    if part.teacher_logprobs is not None:
        sample.teacher_log_probs = part.teacher_logprobs
    sample.metadata["orchard"]["sample_index"] = proxy_sample.get("sample_index")
    return sample


def make_generate(draw: Draw, task_of: Callable[[Any], Task]) -> Callable[..., Awaitable[Any]]:
    """slime's custom generate function over ``draw`` (one rollout) and ``task_of(sample)``."""

    async def generate(args: Any, sample: Any, sampling_params: dict[str, Any]) -> Any:
        result = await draw(task_of(sample))
        branches = trainable_samples(result)
        if not branches:
            return fill(sample, result, None)
        out = [fill(sample, result, branches[0])]
        for branch in branches[1:]:
            twin = type(sample)(
                **{k: getattr(sample, k) for k in ("group_index", "index", "prompt", "label")}
            )
            twin.metadata = dict(sample.metadata or {})
            out.append(fill(twin, result, branch))
        return out[0] if len(out) == 1 else out

    return generate


async def reward(args: Any, sample: Any) -> float:
    """The reward the rollout already earned (graded, dense if applied): slime's custom RM."""
    if sample.reward is None:
        raise SampleError(
            f"sample {sample.index} has no reward (aborted: {sample.metadata.get('orchard')})"
        )
    return float(sample.reward)


@dataclass
class FilterOutput:
    """The shape of slime's ``DynamicFilterOutput``, used only when slime is not importable."""

    keep: bool
    reason: str | None = None


def _filter_output(keep: bool, reason: str | None) -> Any:
    try:
        from slime.rollout.filter_hub.base_types import DynamicFilterOutput
    except ImportError:
        return FilterOutput(keep, reason)
    return DynamicFilterOutput(keep=keep, reason=reason)


def bar_filter(args: Any, samples: list[Any], **kwargs: Any) -> Any:
    """Keep a prompt's whole group when BAR's rules would: its success share inside the band
    (``args.bar_pmin`` / ``args.bar_pmax``, default 0.25-0.75), an easy task kept with
    probability ``1 - pass_rate`` (``kwargs["pass_rate"]``). A group with an aborted sample is
    dropped (BAR's gap filling does not apply: slime normalises rewards over the whole group
    and an aborted sample has none);
    the reason is BAR's (``bar_all_success``, ``bar_all_failure``, ``bar_aborted``, ...)."""
    flat = [s[0] if isinstance(s, list) else s for s in samples]
    if len(flat) < 2:
        return _filter_output(False, "bar_group_of_one")
    default = BarConfig()
    config = BarConfig(group_size=len(flat), max_rollouts=len(flat), stride=len(flat),
                       pmin=float(getattr(args, "bar_pmin", default.pmin)),
                       pmax=float(getattr(args, "bar_pmax", default.pmax)))  # fmt: skip
    outcomes = [outcome_of(_as_result(s), config.success_threshold) for s in flat]
    chosen = select(outcomes, config, final=True, pass_rate=kwargs.get("pass_rate"))
    if (
        chosen.reason == "filled"
    ):  # slime normalises rewards over the whole group: no reward-less member
        return _filter_output(False, "bar_aborted")
    return _filter_output(chosen.kept, None if chosen.kept else f"bar_{chosen.reason}")


def _as_result(sample: Any) -> RolloutResult:
    aborted = sample.status == type(sample).Status.ABORTED or sample.reward is None
    status = Status.ABORTED if aborted else Status.COMPLETED
    return RolloutResult("", "slime", status, 0, "", None, [], None, reward=sample.reward)
