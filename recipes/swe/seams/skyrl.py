"""SkyRL: rollouts as a ``GeneratorOutput``, and a ``GeneratorInterface`` over the runner.

SkyRL's trainer calls ``await generator.generate(input_batch) -> GeneratorOutput``
(``skyrl.train.generators.base``): per trajectory ``prompt_token_ids``, ``response_ids``,
``rewards`` (a float, or one per response token), ``loss_masks``, ``stop_reasons``,
``rollout_logprobs``, ``trajectory_ids``, ``rollout_metrics`` (the other keys optional).
:func:`generator_output` builds that dict from recorded rollouts; :func:`generator_class`
makes a ``GeneratorInterface`` subclass that draws one rollout per prompt of the batch
(``input_batch["env_extras"][i]`` is given to ``task_of``).

A failed rollout cannot be dropped from a SkyRL batch (the output keeps the input's order and
size), and a stand-in reward inside its group would move the group's mean and so every other
member's advantage. So, as SkyRL's own Harbor path does, the whole group of an aborted rollout
(the trajectories sharing its ``trajectory_ids[i].instance_id``) is masked: loss masks all 0,
rewards 0.0 for every member (zero advantage), ``stop_reasons`` ``aborted`` for the aborted
one. Without trajectory ids the groups are unknown and an aborted rollout is an error.

Note: skyrl 0.4.0 needs Python >= 3.12 and imports torch at module level, and 0.3.0 does
not import on 3.11 (its ``tinker`` types use ``typing.TypedDict`` under pydantic). The only
torch these machines' registries give is the 3.11 CPU file, so no side venv on 3.12 can
import either; the tests check the output against the ``GeneratorOutput`` declaration read
from the installed package's source.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

from orchard.rollouts import RolloutResult, Status, Task

from .common import SampleError, main_sample, split, trainable_samples

STOP_REASONS = {Status.COMPLETED: "stop", Status.TRUNCATED: "length", Status.ABORTED: "aborted"}


def _group_key(trajectory_id: Any) -> Any:
    return getattr(trajectory_id, "instance_id", trajectory_id)


def generator_output(
    results: Sequence[RolloutResult], trajectory_ids: Sequence[Any] | None = None
) -> dict[str, Any]:
    if trajectory_ids is not None and len(trajectory_ids) != len(results):
        raise SampleError(f"{len(trajectory_ids)} trajectory ids for {len(results)} rollouts")
    failed = [i for i, r in enumerate(results) if not trainable_samples(r)]
    if failed and trajectory_ids is None:
        raise SampleError(
            f"rollouts {failed} aborted and no trajectory ids say which groups to mask "
            f"(first fault: {results[failed[0]].fault or 'no reward'})"
        )
    masked_groups = (
        {_group_key(trajectory_ids[i]) for i in failed} if trajectory_ids is not None else set()
    )
    prompts: list[list[int]] = []
    responses: list[list[int]] = []
    rewards: list[float] = []
    masks: list[list[int]] = []
    logprobs: list[list[float]] = []
    stops: list[str] = []
    for i, result in enumerate(results):
        if i in failed:
            prompts.append([0])
            responses.append([0])
            rewards.append(0.0)
            masks.append([0])
            logprobs.append([0.0])
            stops.append("aborted")
            continue
        part = split(main_sample(result))
        masked = trajectory_ids is not None and _group_key(trajectory_ids[i]) in masked_groups
        prompts.append(part.prompt_ids)
        responses.append(part.response_ids)
        rewards.append(0.0 if masked else float(part.reward or 0.0))
        masks.append([0] * len(part.response_mask) if masked else part.response_mask)
        logprobs.append(part.response_logprobs or [0.0] * len(part.response_ids))
        stops.append(STOP_REASONS[result.status])
    graded = [r.reward for r in results if r.reward is not None]
    return {
        "prompt_token_ids": prompts, "response_ids": responses, "rewards": rewards,
        "loss_masks": masks, "stop_reasons": stops, "rollout_logprobs": logprobs,
        "trajectory_ids": list(trajectory_ids) if trajectory_ids is not None else None,
        "rollout_metrics": {"orchard/aborted": len(failed), "orchard/masked_groups": len(masked_groups),
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
