"""A proxy sample as the prompt / response split every trainer wants.

The recording proxy's sample (docs/modelproxy.md "Samples") is one branch of a session:
``tokens`` (the leaf call's prompt + completion), ``loss_mask`` (1 on every token the model
sampled along the branch), ``logprobs`` (the engine's, 0.0 off the mask) and
``prompt_length`` (the root call's prompt). The trainers split it at ``prompt_length``: the
prompt is conditioning only; the response holds the model's turns (mask 1) and what came
between them (tool results, template tokens: mask 0).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from orchard.rollouts import RolloutResult, Status


class SampleError(ValueError):
    """A sample that cannot be trained on as tokens (not token-exact, inconsistent lengths)."""


@dataclass(frozen=True)
class Split:
    prompt_ids: list[int]
    response_ids: list[int]
    response_mask: list[int]
    response_logprobs: list[float] | None
    reward: float | None
    teacher_logprobs: list[float] | None = None


def split(sample: Mapping[str, Any]) -> Split:
    tokens, mask = sample.get("tokens"), sample.get("loss_mask")
    if not sample.get("token_exact") or tokens is None or mask is None:
        raise SampleError(
            f"sample {sample.get('session_id')}/{sample.get('sample_index')} is not token-exact "
            f"({(sample.get('not_token_exact') or {}).get('reason', 'no tokens')}): no token form to train on"
        )
    n = sample.get("prompt_length")
    if not isinstance(n, int) or not 0 < n <= len(tokens) or len(mask) != len(tokens):
        raise SampleError(f"sample {sample.get('session_id')}: prompt_length {n!r} and "
                          f"{len(tokens)} tokens / {len(mask)} mask entries do not fit")  # fmt: skip
    if any(mask[:n]):
        raise SampleError(f"sample {sample.get('session_id')}: loss mask set inside the prompt")

    def tail(key: str) -> list[float] | None:
        values = sample.get(key)
        if values is None:
            return None
        if len(values) != len(tokens):
            raise SampleError(
                f"sample {sample.get('session_id')}: {key} has {len(values)} entries for {len(tokens)} tokens"
            )
        return [float(v) for v in values[n:]]

    reward = sample.get("reward")
    return Split(list(tokens[:n]), list(tokens[n:]), [int(m) for m in mask[n:]], tail("logprobs"),
                 None if reward is None else float(reward), tail("teacher_logprobs"))  # fmt: skip


def trainable_samples(result: RolloutResult) -> list[dict[str, Any]]:
    """The rollout's samples a trainer may use: graded, token-exact, marked trainable."""
    if result.status is Status.ABORTED or result.reward is None:
        return []
    return [s for s in result.samples if s.get("trainable", True) and s.get("token_exact")]


def main_sample(result: RolloutResult) -> dict[str, Any]:
    """The branch holding the whole run (the most tokens) for trainers that take one sequence."""
    samples = trainable_samples(result)
    if not samples:
        raise SampleError(
            f"rollout of {result.task_id} ({result.status.value}, reward {result.reward}) has no "
            f"trainable token-exact sample (fault: {result.fault or 'none'})"
        )
    return max(samples, key=lambda s: len(s["tokens"]))
