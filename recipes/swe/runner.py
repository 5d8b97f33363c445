"""The SWE runner: tasks -> rollouts (``orchard.rollouts.run_rollouts``) -> graded by the
rewards service -> the reward attached to each rollout's proxy session.

Grading is not done inside the rollout (``run_rollouts``' ``grade`` hook, which holds the
agent's sandbox while it runs): the rewards service grades the rollout's diff in a fresh
sandbox of the instance's image, exactly as ``swebench`` would, so the agent's sandbox is
freed first and grading runs beside the next rollouts (``grade_concurrency`` at once; the
service has its own bound). As each rollout ends its grading starts; the reward is then
written onto the session (the proxy's ``finish``, which may be called again) and the
session's samples are read back with it.

Outcomes stay apart: an ABORTED rollout is not graded; a grading the platform could not do
(``GradeReport.reward`` None, or the service failing) marks the rollout ``grade_fault`` and
finishes its session with fault ``infrastructure`` (samples masked, never a zero reward).
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import orchard
from orchard.rollouts import (
    Harness,
    Job,
    Limits,
    ModelProxyClient,
    ProxyError,
    RolloutResult,
    SandboxOptions,
    Status,
    Task,
    run_rollout,
    run_rollouts,
)

from .tasks import SweTask

INSTANCE_KEY = "instance"
"""``Task.metadata`` key holding the row the rewards service grades (``SweTask.grading_instance``)."""


class NotGradableError(ValueError):
    """A task whose metadata carries no instance row for the grader."""


def rollout_tasks(tasks: Sequence[SweTask]) -> list[Task]:
    """The rollout tasks of loaded SWE tasks, each carrying its grading row (refuses a task
    that cannot be graded, naming it: ``TaskNotGradable``)."""
    out = []
    for swe in tasks:
        task = swe.rollout_task()
        metadata = {**task.metadata, INSTANCE_KEY: swe.grading_instance()}
        out.append(dataclasses.replace(task, metadata=metadata))
    return out


def instance_of(task: Task) -> dict[str, Any]:
    """The row a task is graded with (set by :func:`rollout_tasks`)."""
    row = task.metadata.get(INSTANCE_KEY)
    if not isinstance(row, dict):
        raise NotGradableError(f"task {task.id}: no instance row in its metadata")
    return row


@dataclass(frozen=True)
class SweOptions:
    samples_per_task: int = 1
    concurrency: int = 8
    grade_concurrency: int = 4
    scheme: str = "pm1"
    """The rewards service's scheme: ``pm1`` (+1/-1), ``binary`` or ``pass_rate``."""
    grade_timeout: float = 3600.0
    model_version: str = ""


@dataclass
class SweRollout:
    """One rollout and its grading."""

    index: int
    sample: int
    result: RolloutResult
    resolved: bool = False
    grade: dict[str, Any] = field(default_factory=dict)
    grade_fault: str | None = None

    @property
    def reward(self) -> float | None:
        return self.result.reward

    def record(self) -> dict[str, Any]:
        """The JSON line of ``rollouts.jsonl`` (the evaluation's input)."""
        r = self.result
        return {
            "rollout_id": f"{r.task_id}#{self.sample}", "task_id": r.task_id,
            "sample": self.sample, "harness": r.harness, "status": str(r.status),
            "steps": r.steps, "reward": r.reward, "resolved": self.resolved,
            "fault": r.fault, "grade_fault": self.grade_fault, "session_id": r.session_id,
            "seconds": r.seconds, "diff": r.diff, "submission": r.submission,
            "grade": self.grade, "detail": r.detail, "transcript": r.transcript,
        }  # fmt: skip


def _report_dict(report: orchard.GradeReport) -> dict[str, Any]:
    return {
        "kind": report.kind, "resolved": report.resolved, "reward": report.reward,
        "reason": report.reason, "apply_method": report.apply_method,
        "fail_to_pass": list(report.fail_to_pass), "pass_to_pass": list(report.pass_to_pass),
        "integrity": report.integrity, "seconds": report.duration_seconds,
    }  # fmt: skip


async def run_swe(
    client: orchard.AsyncOrchard,
    harness: Harness,
    tasks: Sequence[Task],
    *,
    proxy: ModelProxyClient,
    model: str,
    limits: Limits | None = None,
    options: SweOptions | None = None,
    sandbox: SandboxOptions | None = None,
    on_graded: Callable[[SweRollout], None] | None = None,
) -> list[SweRollout]:
    """``samples_per_task`` rollouts of every task, graded; in the order (task, sample)."""
    options = options or SweOptions()
    jobs = [
        Job(task, metadata={"sample": s}) for task in tasks for s in range(options.samples_per_task)
    ]
    gate = asyncio.Semaphore(options.grade_concurrency)
    graded: dict[int, asyncio.Task[SweRollout]] = {}

    async def grade(index: int, result: RolloutResult) -> SweRollout:
        job = jobs[index]
        rollout = SweRollout(index, int((job.metadata or {})["sample"]), result)
        if result.status is not Status.ABORTED:
            async with gate:
                try:
                    await _grade(client, proxy, job.task, rollout, options)
                except Exception as err:  # a bug, not a fault: this rollout's, no other's
                    rollout.grade_fault = f"runner: {type(err).__name__}: {err}"
                    result.reward = None
        if on_graded is not None:
            on_graded(rollout)
        return rollout

    def started(index: int, result: RolloutResult) -> None:
        graded[index] = asyncio.ensure_future(grade(index, result))

    await run_rollouts(
        client, harness, jobs, proxy=proxy, model=model, concurrency=options.concurrency,
        limits=limits, sandbox=sandbox, model_version=options.model_version,
        on_result=started,
    )  # fmt: skip
    return [await graded[i] for i in range(len(jobs))]


async def _grade(
    client: orchard.AsyncOrchard,
    proxy: ModelProxyClient,
    task: Task,
    rollout: SweRollout,
    options: SweOptions,
) -> None:
    result = rollout.result
    candidate = result.diff or result.submission or ""
    fault = ""
    try:
        report = await client.rewards.grade(
            instance_of(task), candidate, scheme=options.scheme, timeout=options.grade_timeout
        )
    except orchard.OrchardError as err:
        fault = f"rewards: {type(err).__name__}: {err}"
    else:
        rollout.grade = _report_dict(report)
        if report.reward is None:
            fault = f"rewards: infrastructure: {report.reason}"
        else:
            rollout.resolved = report.resolved
            result.reward = report.reward
    if fault:
        rollout.grade_fault = fault
        result.reward = None
    if result.session_id is None:
        return
    try:
        if fault:
            await proxy.finish(result.session_id, None, "infrastructure", fault)
        else:
            await proxy.finish(result.session_id, result.reward)
        result.samples = await proxy.samples(result.session_id)
    except ProxyError as err:
        rollout.grade_fault = f"proxy: {err}"
        result.reward = None


class SweDraw:
    """One graded rollout per call, ``await draw(task) -> RolloutResult`` (reward set, or None
    with ``detail["grade_fault"]``): the ``draw`` a sampler that decides how many rollouts a
    task gets (Balanced Adaptive Rollout, ``orchard.recipes.swe.bar.sample_group``) is given.
    ``concurrency`` bounds the rollouts in flight across every caller."""

    def __init__(
        self,
        client: orchard.AsyncOrchard,
        harness: Harness,
        *,
        proxy: ModelProxyClient,
        model: str,
        limits: Limits | None = None,
        options: SweOptions | None = None,
        sandbox: SandboxOptions | None = None,
    ) -> None:
        self.client, self.harness, self.proxy, self.model = client, harness, proxy, model
        self.limits, self.sandbox = limits, sandbox
        self.options = options or SweOptions()
        self._rollouts = asyncio.Semaphore(self.options.concurrency)
        self._grades = asyncio.Semaphore(self.options.grade_concurrency)
        self.drawn: list[SweRollout] = []

    async def __call__(self, task: Task) -> RolloutResult:
        async with self._rollouts:
            result = await run_rollout(
                self.client, self.harness, task, proxy=self.proxy, model=self.model,
                limits=self.limits, sandbox=self.sandbox, model_version=self.options.model_version,
            )  # fmt: skip
        rollout = SweRollout(
            len(self.drawn), sum(1 for d in self.drawn if d.result.task_id == task.id), result
        )
        self.drawn.append(rollout)
        if result.status is not Status.ABORTED:
            async with self._grades:
                await _grade(self.client, self.proxy, task, rollout, self.options)
        if rollout.grade_fault:
            result.detail["grade_fault"] = rollout.grade_fault
        return result
