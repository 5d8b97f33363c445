"""SkyRL: rollouts as a ``GeneratorOutput``, and a ``GeneratorInterface`` over the runner.

SkyRL's trainer calls ``await generator.generate(input_batch) -> GeneratorOutput``
(``skyrl.train.generators.base``): per trajectory ``prompt_token_ids``, ``response_ids``,
``rewards`` (a float, or one per response token), ``loss_masks``, ``stop_reasons``,
``rollout_logprobs``, ``trajectory_ids``, ``rollout_metrics`` (the other keys optional).
:func:`generator_output` builds that dict from recorded rollouts; :func:`generator_class`
makes a ``GeneratorInterface`` subclass that draws one rollout per prompt of the batch
(``input_batch["env_extras"][i]`` is given to ``task_of``).

A failed rollout cannot be dropped from a SkyRL batch (the output keeps the input's order and
size): it is kept with its whole loss mask 0 and reward 0.0 and ``stop_reasons`` ``aborted``,
so it teaches nothing; SkyRL's own Harbor path masks such a rollout's group the same way.

Note: skyrl 0.4.0 needs Python >= 3.12 and 0.3.0 does not import on 3.11 (its ``tinker``
types use ``typing.TypedDict`` under pydantic), so the tests check the output against the
``GeneratorOutput`` declaration read from the installed package's source.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

from orchard.rollouts import RolloutResult, Status, Task

from .common import main_sample, split, trainable_samples

STOP_REASONS = {Status.COMPLETED: "stop", Status.TRUNCATED: "length", Status.ABORTED: "aborted"}


def generator_output(
    results: Sequence[RolloutResult], trajectory_ids: Sequence[Any] | None = None
) -> dict[str, Any]:
    prompts: list[list[int]] = []
    responses: list[list[int]] = []
    rewards: list[float] = []
    masks: list[list[int]] = []
    logprobs: list[list[float]] = []
    stops: list[str] = []
    aborted = 0
    for result in results:
        if not trainable_samples(result):
            aborted += 1
            prompts.append([0])
            responses.append([0])
            rewards.append(0.0)
            masks.append([0])
            logprobs.append([0.0])
            stops.append("aborted")
            continue
        part = split(main_sample(result))
        prompts.append(part.prompt_ids)
        responses.append(part.response_ids)
        rewards.append(float(part.reward or 0.0))
        masks.append(part.response_mask)
        logprobs.append(part.response_logprobs or [0.0] * len(part.response_ids))
        stops.append(STOP_REASONS[result.status])
    graded = [r.reward for r in results if r.reward is not None]
    return {
        "prompt_token_ids": prompts, "response_ids": responses, "rewards": rewards,
        "loss_masks": masks, "stop_reasons": stops, "rollout_logprobs": logprobs,
        "trajectory_ids": list(trajectory_ids) if trajectory_ids is not None else None,
        "rollout_metrics": {"orchard/aborted": aborted,
                            "orchard/mean_reward": sum(graded) / len(graded) if graded else 0.0},
    }  # fmt: skip


def generator_class(
    draw: Callable[[Task], Awaitable[RolloutResult]], task_of: Callable[[Mapping[str, Any]], Task]
) -> type:
    """A ``GeneratorInterface`` subclass over ``draw`` (SkyRL imported here)."""
    import asyncio

    from skyrl.train.generators.base import GeneratorInterface

    class OrchardSweGenerator(GeneratorInterface):  # type: ignore[misc]
        async def generate(self, input_batch: Mapping[str, Any]) -> dict[str, Any]:
            extras = input_batch.get("env_extras") or [{} for _ in input_batch["prompts"]]
            results = await asyncio.gather(*(draw(task_of(e)) for e in extras))
            return generator_output(results, input_batch.get("trajectory_ids"))

    return OrchardSweGenerator
