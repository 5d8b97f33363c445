"""TRL: recorded samples as SFT rows and GRPO batches, and an ``environment_factory`` class.

- :func:`sft_row`: a proxy sample (or a CA-SFT record with its token form) as a pre-tokenised
  SFT row, ``{"input_ids", "assistant_masks"}``: ``SFTTrainer`` takes a dataset that already
  has ``input_ids`` as it is and builds ``labels`` from ``assistant_masks`` (-100 where 0), so
  only the tokens the model sampled (and, for CA-SFT, only the steps before the mistake) are
  learnt, on the engine's own tokens.
- :func:`grpo_batch`: groups of recorded samples as the batch ``GRPOTrainer``'s loss reads
  (``prompt_ids`` left-padded, ``completion_ids`` right-padded, ``completion_mask`` = 1 on every
  response token so tool results stay in the attention, ``tool_mask`` = the proxy's loss mask
  so they are not learnt, ``advantages`` = the group-normalised rewards, ``old_per_token_logps``
  = the engine's recorded log-probabilities). :func:`recorded_grpo_trainer` makes a
  ``GRPOTrainer`` subclass that trains on such batches instead of generating: TRL's own GRPO
  loss, optimiser and loop on rollouts this recipe ran (off-policy from TRL's view; the
  recorded log-probabilities are the behaviour policy's).
- :class:`SweEnvironment`: for ``GRPOTrainer(environment_factory=...)`` (TRL >= 1.x): one
  instance per rollout, ``reset(**row)`` opens a sandbox for the row's task, ``bash`` is the
  tool the model calls, ``get_reward`` grades the sandbox's diff with a grader you give
  (``Rewards.grade`` of the SDK); TRL reads the tool's schema from its signature and docstring.

TRL, torch and datasets are imported inside the functions that need them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from orchard.rollouts import Task

from .common import SampleError, split


def sft_row(sample: Mapping[str, Any]) -> dict[str, list[int]]:
    """``{"input_ids", "assistant_masks"}`` from a token-exact sample or CA-SFT record."""
    tokens, mask = sample.get("tokens"), sample.get("loss_mask")
    if tokens is None or mask is None or len(tokens) != len(mask):
        raise SampleError(f"sample {sample.get('session_id')}: no token form (tokens + loss_mask)")
    if not any(mask):
        raise SampleError(f"sample {sample.get('session_id')}: nothing to learn (loss mask all 0)")
    return {"input_ids": [int(t) for t in tokens], "assistant_masks": [int(m) for m in mask]}


def advantages(rewards: Sequence[float], eps: float = 1e-4) -> list[float]:
    """GRPO's group-relative advantage: (r - mean) / (std + eps), the population std."""
    mean = sum(rewards) / len(rewards)
    std = (sum((r - mean) ** 2 for r in rewards) / len(rewards)) ** 0.5
    return [(r - mean) / (std + eps) for r in rewards]


def grpo_batch(groups: Sequence[Sequence[Mapping[str, Any]]], pad_id: int) -> dict[str, Any]:
    """One GRPO batch (torch tensors) from groups of samples of the same task."""
    import torch

    parts, advs = [], []
    for group in groups:
        split_group = [split(s) for s in group]
        if any(p.reward is None for p in split_group):
            raise SampleError("a sample of the group has no reward")
        advs += advantages([p.reward for p in split_group if p.reward is not None])
        parts += split_group
    p_len = max(len(p.prompt_ids) for p in parts)
    c_len = max(len(p.response_ids) for p in parts)

    def left(values: list[int], fill: int) -> list[int]:
        return [fill] * (p_len - len(values)) + values

    def right(values: Sequence[float], fill: float) -> list[float]:
        return list(values) + [fill] * (c_len - len(values))

    batch = {
        "prompt_ids": torch.tensor([left(p.prompt_ids, pad_id) for p in parts]),
        "prompt_mask": torch.tensor([left([1] * len(p.prompt_ids), 0) for p in parts]),
        "completion_ids": torch.tensor(
            [right(p.response_ids, pad_id) for p in parts], dtype=torch.long
        ),
        "completion_mask": torch.tensor(
            [right([1] * len(p.response_ids), 0) for p in parts], dtype=torch.long
        ),
        "tool_mask": torch.tensor([right(p.response_mask, 0) for p in parts], dtype=torch.long),
        "advantages": torch.tensor(advs, dtype=torch.float32),
    }
    if all(p.response_logprobs is not None for p in parts):
        batch["old_per_token_logps"] = torch.tensor(
            [right(p.response_logprobs or [], 0.0) for p in parts], dtype=torch.float32
        )
    batch["num_items_in_batch"] = batch["tool_mask"].sum()
    return batch


def recorded_grpo_trainer(batches: Iterator[dict[str, Any]]) -> type:
    """A ``trl.GRPOTrainer`` subclass whose generation step hands out ``batches`` (from
    :func:`grpo_batch`) instead of sampling: give it ``reward_funcs`` for the constructor's
    check (they are not called) and a dataset of prompts as long as the run."""
    from trl.trainer.grpo_trainer import GRPOTrainer

    class RecordedGRPOTrainer(GRPOTrainer):  # type: ignore[misc]
        def _generate_and_score_completions(self, inputs: Any) -> dict[str, Any]:
            try:
                batch = next(batches)
            except StopIteration:
                raise SampleError("no more recorded batches for this step") from None
            return {
                k: v.to(self.accelerator.device) if hasattr(v, "to") else v
                for k, v in batch.items()
            }

    return RecordedGRPOTrainer


Grader = Callable[[Task, str], float | None]
"""(task, diff) -> reward, None for an infrastructure failure (TRL ignores a None reward)."""


class SweEnvironment:
    """One rollout's environment for ``GRPOTrainer(environment_factory=...)``.

    Build the factory with :func:`environment_factory`; TRL calls it without arguments, once
    per concurrent rollout, and reuses instances through ``reset``.
    """

    def __init__(
        self,
        client: Any,
        task_of: Callable[[Mapping[str, Any]], Task],
        grade: Grader,
        *,
        output_limit: int = 8000,
        command_timeout: float = 120.0,
    ) -> None:
        self._client = client
        self._task_of = task_of
        self._grade = grade
        self._limit = output_limit
        self._timeout = command_timeout
        self._sandbox: Any = None
        self._task: Task | None = None

    def reset(self, **row: Any) -> str | None:
        """Close the last sandbox, open one for ``row``'s task, put the task in place."""
        self._close()
        task = self._task_of(row)
        sandbox = (
            self._client.sandboxes.create(image=task.image)
            if task.image
            else self._client.sandboxes.create()
        )
        self._sandbox, self._task = sandbox, task
        for path, data in task.files.items():
            sandbox.write_file(path, data)
        for command in task.setup:
            done = sandbox.exec(command, cwd=task.workdir, timeout=self._timeout)
            if done.exit_code != 0:
                raise RuntimeError(
                    f"task {task.id}: setup {command!r} exited {done.exit_code}: {done.stderr_text[-500:]}"
                )
        return None

    def bash(self, command: str) -> str:
        """Run a bash command in the task's repository and return its exit code and output.

        Args:
            command: The bash command line to run.
        """
        if self._sandbox is None or self._task is None:
            return "error: the environment was not reset"
        done = self._sandbox.exec(command, cwd=self._task.workdir, timeout=self._timeout)
        text = done.stdout_text + done.stderr_text
        if len(text) > self._limit:
            half = self._limit // 2
            text = (
                f"{text[:half]}\n[... {len(text) - self._limit} characters cut ...]\n{text[-half:]}"
            )
        return f"exit code {done.exit_code}\n{text}"

    def get_reward(self) -> float | None:
        """The task's reward on the sandbox's ``git diff`` (TRL calls it once per rollout)."""
        if self._sandbox is None or self._task is None:
            return None
        diff = self._sandbox.exec(
            "git diff", cwd=self._task.workdir, timeout=self._timeout
        ).stdout_text
        try:
            return self._grade(self._task, diff)
        finally:
            self._close()

    def _close(self) -> None:
        if self._sandbox is not None:
            sandbox, self._sandbox = self._sandbox, None
            sandbox.delete()


def environment_factory(
    client: Any, task_of: Callable[[Mapping[str, Any]], Task], grade: Grader, **options: Any
) -> Callable[[], SweEnvironment]:
    """The zero-argument factory ``GRPOTrainer(environment_factory=...)`` calls."""

    def make() -> SweEnvironment:
        return SweEnvironment(client, task_of, grade, **options)

    return make
