"""verl: an ``AgentLoopBase`` that runs one of this recipe's rollouts per dataset row.

verl (PyPI ``verl`` 0.9.1, ``verl.experimental.agent_loop``) instantiates an agent loop per
sample, by name (the row's ``agent_name``), with hydra, from an agent-loop config file
(``actor_rollout_ref.rollout.agent.agent_loop_config_path``)::

    - name: orchard_swe
      _target_: orchard.recipes.swe.seams.verl.OrchardSweAgentLoop
      draw: my_hooks.draw            # async (Task) -> RolloutResult: the runner, through the proxy
      task_of: my_hooks.task_of      # (row fields) -> Task
      retries_on_abort: 2

``run(sampling_params, **row)`` draws the rollout and answers ``AgentLoopOutput``:
``prompt_ids`` / ``response_ids`` / ``response_mask`` / ``response_logprobs`` from the
recorded proxy sample (the branch with the whole run), ``reward_score`` the rollout's
reward, ``num_turns`` its messages, ``extra_fields["orchard"]`` the task, session, status
and diff (``teacher_logprobs`` too, when the sample has them). The model calls go through
the recording proxy, whose upstream is the inference servers verl started; verl's
``sampling_params`` are not the harness's (the harness sets its own; the proxy's
``--upstream-extra-body`` adds fields). verl cannot drop one sample of a batch, so an
aborted rollout is drawn again (``retries_on_abort``) and then raises with its fault.

The class is built on first use (``OrchardSweAgentLoop`` is a module attribute made by
``__getattr__``), so importing this module does not import verl.
"""

from __future__ import annotations

import importlib
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from orchard.rollouts import RolloutResult, Status, Task

from .common import SampleError, main_sample, split

_CLASS: type | None = None


def _load(path: str | Callable[..., Any]) -> Callable[..., Any]:
    if callable(path):
        return path
    module, _, name = str(path).rpartition(".")
    if not module:
        raise ValueError(f"{path!r} is not an import path (module.function)")
    found = getattr(importlib.import_module(module), name)
    if not callable(found):
        raise ValueError(f"{path!r} is not callable")
    return found  # type: ignore[no-any-return]


def to_agent_loop_output(result: RolloutResult, sample: Mapping[str, Any]) -> Any:
    """verl's ``AgentLoopOutput`` for one rollout's recorded sample."""
    from verl.experimental.agent_loop.agent_loop import AgentLoopMetrics, AgentLoopOutput

    part = split(sample)
    extra: dict[str, Any] = {"orchard": {
        "task_id": result.task_id, "session_id": result.session_id, "status": result.status.value,
        "steps": result.steps, "diff": result.diff, "sample_index": sample.get("sample_index"),
        "outcome_reward": result.detail.get("outcome_reward", result.reward),
    }}  # fmt: skip
    if part.teacher_logprobs is not None:
        extra["teacher_logprobs"] = part.teacher_logprobs
    return AgentLoopOutput(
        prompt_ids=part.prompt_ids, response_ids=part.response_ids,
        response_mask=part.response_mask, response_logprobs=part.response_logprobs,
        reward_score=part.reward, num_turns=len(sample.get("messages") or ()),
        metrics=AgentLoopMetrics(), extra_fields=extra,
    )  # fmt: skip


def agent_loop_class() -> type:
    """``OrchardSweAgentLoop``, a subclass of verl's ``AgentLoopBase`` (verl imported here)."""
    global _CLASS
    if _CLASS is not None:
        return _CLASS
    from verl.experimental.agent_loop.agent_loop import AgentLoopBase

    class OrchardSweAgentLoop(AgentLoopBase):  # type: ignore[misc]
        def __init__(
            self,
            *args: Any,
            draw: str | Callable[[Task], Awaitable[RolloutResult]],
            task_of: str | Callable[[Mapping[str, Any]], Task],
            retries_on_abort: int = 2,
            **kwargs: Any,
        ) -> None:
            super().__init__(*args, **kwargs)
            self.draw = _load(draw)
            self.task_of = _load(task_of)
            self.retries_on_abort = int(retries_on_abort)

        async def run(self, sampling_params: dict[str, Any], **kwargs: Any) -> Any:
            task = self.task_of(kwargs)
            for _ in range(self.retries_on_abort + 1):
                result: RolloutResult = await self.draw(task)
                if result.status is not Status.ABORTED and result.reward is not None:
                    return to_agent_loop_output(result, main_sample(result))
            raise SampleError(
                f"task {task.id}: rollout aborted {self.retries_on_abort + 1} times "
                f"(last fault: {result.fault or 'no reward'}); verl cannot drop one sample"
            )

    OrchardSweAgentLoop.__module__ = __name__
    OrchardSweAgentLoop.__qualname__ = "OrchardSweAgentLoop"
    _CLASS = OrchardSweAgentLoop
    return _CLASS


def register(name: str = "orchard_swe") -> type:
    """Register the loop in verl's registry under ``name`` (``agent_name`` in the rows)."""
    from verl.experimental.agent_loop.agent_loop import register as verl_register

    return verl_register(name)(agent_loop_class())  # type: ignore[no-any-return]


def __getattr__(name: str) -> Any:
    if name == "OrchardSweAgentLoop":
        return agent_loop_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
