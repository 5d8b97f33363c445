"""The Claw runner: k trials of every task on every harness through ``orchard.rollouts``, each
graded from the services' audit log and final state, the score attached to its proxy session.

One trial is one ``orchard.rollouts.run_rollout`` (a fresh sandbox, a proxy session), with:

- the task as a rollout task (:func:`rollout_task`: prompt, image, workdir, files, setup; the
  :class:`ClawTask` itself in ``metadata["claw_task"]``);
- the harness wrapped in :class:`TrialHarness`, which starts the task's services in the
  sandbox with its fixtures (``ClawServices.start``) before the agent runs, then runs it:
  a :class:`~orchard.recipes.claw.harness.ClawHarness` (the ReAct loop, the oracle, the
  null run: driver-side, given the services) by ``run_claw``; any other harness (a CLI of the tools layer: Codex, OpenClaw)
  by ``run`` with the services' usage text (how to call them over HTTP) after the prompt;
- the grade hook (``run_rollouts``' ``grade``), which reads the audit log and the state,
  runs the verifier script for a script grader, and returns the score's total as the reward:
  the runner finishes the session with it, so the training samples carry it.

Outcomes: a trial whose sandbox, services (not started, or failing for a reason that is not
the agent's), harness, model endpoint or proxy failed is ABORTED: an infrastructure fault,
never a failed trial (the metrics leave it out and count it apart). An agent that kills or
replaces its services is the agent's doing: it scores 0 (a fatal violation says why).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import orchard
from orchard.rollouts import (
    Harness,
    HarnessRun,
    Job,
    Limits,
    ModelEndpoint,
    ModelProxyClient,
    RolloutResult,
    SandboxOptions,
    Status,
    Task,
    run_rollouts,
)

from .grading import GradingError, Score, VerifierOutcome, Violation, audit_dicts, grade
from .harness import AnyHarness, TrialContext
from .metrics import TrialOutcome
from .services import ClawServices, ServiceOptions, ServicesError
from .tasks import PASS_THRESHOLD, ClawTask, ScriptGrader, file_bytes

if TYPE_CHECKING:
    from orchard import AsyncSandbox

CLAW_TASK = "claw_task"
"""``Task.metadata`` key holding the :class:`ClawTask`."""


def rollout_task(task: ClawTask) -> Task:
    """The rollout task of a Claw task (the task itself in ``metadata["claw_task"]``)."""
    env = task.environment
    return Task(
        id=task.id,
        prompt=task.prompt,
        image=env.image,
        workdir=env.workdir,
        files={path: file_bytes(content) for path, content in env.files.items()},
        setup=tuple(env.setup),
        metadata={CLAW_TASK: task, "category": task.category},
    )


def claw_task_of(task: Task) -> ClawTask:
    found = task.metadata.get(CLAW_TASK)
    if not isinstance(found, ClawTask):
        raise ValueError(f"task {task.id}: not a Claw task (no {CLAW_TASK!r} in its metadata)")
    return found


class TrialHarness:
    """``inner`` with the task's services started first (see the module's docstring). The
    services of each running trial are kept by sandbox id for the grade hook."""

    def __init__(self, inner: AnyHarness, options: ServiceOptions | None = None) -> None:
        self.inner = inner
        self.name = inner.name
        self.needs_tools_layer = inner.needs_tools_layer
        self.runs_in_sandbox = bool(getattr(inner, "runs_in_sandbox", inner.needs_tools_layer))
        self.options = options or ServiceOptions()
        self.live: dict[str, ClawServices | None] = {}

    async def run(
        self, sandbox: AsyncSandbox, task: Task, model: ModelEndpoint, limits: Limits
    ) -> HarnessRun:
        claw = claw_task_of(task)
        if claw.max_steps is not None:
            limits = dataclasses.replace(limits, max_steps=claw.max_steps)
        services: ClawServices | None = None
        if claw.fixtures is not None:
            try:
                services = await ClawServices.start(sandbox, claw.fixtures, self.options)
            except ServicesError as err:
                return HarnessRun(Status.ABORTED, fault=f"services: {type(err).__name__}: {err}")
        self.live[sandbox.id] = services
        try:
            run_claw = getattr(self.inner, "run_claw", None)
            if run_claw is not None:
                run: HarnessRun = await run_claw(
                    TrialContext(sandbox, claw, services, model, limits)
                )
            else:
                prompt = claw.prompt if services is None else f"{claw.prompt}\n\n{services.usage()}"
                inner: Harness = self.inner  # type: ignore[assignment]
                run = await inner.run(
                    sandbox, dataclasses.replace(task, prompt=prompt), model, limits
                )
        except Exception:
            await self.release(sandbox.id)
            raise
        if run.status is Status.ABORTED:
            await self.release(sandbox.id)
        return run

    async def release(self, sandbox_id: str) -> ClawServices | None:
        services = self.live.pop(sandbox_id, None)
        if services is not None:
            with contextlib.suppress(Exception):
                await services.close()
        return services

    async def aclose(self) -> None:
        for sandbox_id in list(self.live):
            await self.release(sandbox_id)
        close = getattr(self.inner, "aclose", None)
        if close is not None:
            await close()


async def run_verifier(sandbox: AsyncSandbox, spec: ScriptGrader) -> VerifierOutcome:
    """Write the verifier's files and run its command in the sandbox."""
    for path, content in spec.files.items():
        await sandbox.write_file(path, file_bytes(content))
    await sandbox.make_dir(spec.workdir, parents=True)
    done = await sandbox.exec(["sh", "-c", "exec 2>&1\n" + spec.command], cwd=spec.workdir,
                              timeout=spec.timeout)  # fmt: skip
    output = (done.stdout + done.stderr).decode("utf-8", "replace")
    return VerifierOutcome(done.exit_code, output[-20_000:], done.timed_out)


def broken_services_score(task: ClawTask, err: ServicesError) -> Score:
    """The score of a trial whose agent killed or replaced its services: 0, and why."""
    why = Violation("the services were broken by the agent", 1.0, True,
                    f"{type(err).__name__}: {err}")  # fmt: skip
    return Score(0.0, False, 0.0, task.grader.kind, [], [why])


class Grader:
    """The grade hook of one run: scores kept by sandbox id (the rollout's ``sandbox_id``)."""

    def __init__(self, harnesses: Sequence[TrialHarness]) -> None:
        self.harnesses = harnesses
        self.scores: dict[str, Score] = {}
        self.evidence: dict[str, dict[str, Any]] = {}

    def _services(self, sandbox_id: str) -> tuple[bool, ClawServices | None]:
        for h in self.harnesses:
            if sandbox_id in h.live:
                return True, h.live[sandbox_id]
        return False, None

    async def __call__(self, sandbox: AsyncSandbox, task: Task, run: HarnessRun) -> float:
        claw = claw_task_of(task)
        known, services = self._services(sandbox.id)
        if not known:
            raise GradingError(f"no services were started for sandbox {sandbox.id}")
        try:
            score = await self._grade(sandbox, claw, services, run)
        finally:
            for h in self.harnesses:
                if sandbox.id in h.live:
                    await h.release(sandbox.id)
        self.scores[sandbox.id] = score
        return score.total

    async def _grade(
        self, sandbox: AsyncSandbox, claw: ClawTask, services: ClawServices | None, run: HarnessRun
    ) -> Score:
        audit: list[dict[str, Any]] = []
        state: dict[str, Any] = {}
        if services is not None:
            try:
                audit = audit_dicts(await services.audit())
                state = await services.state()
            except ServicesError as err:
                if err.fault != "task":
                    raise
                return broken_services_score(claw, err)
        self.evidence[sandbox.id] = {"audit": audit, "state": state}
        verifier = None
        if isinstance(claw.grader, ScriptGrader):
            verifier = await run_verifier(sandbox, claw.grader)
        return grade(claw, audit, state, run.submission, verifier=verifier)


@dataclass
class ClawTrial:
    """One trial: the rollout, its score (None when ABORTED), and what the grader read."""

    task: ClawTask
    harness: str
    index: int
    result: RolloutResult
    score: Score | None
    audit: list[dict[str, Any]] = field(default_factory=list)
    state: dict[str, Any] = field(default_factory=dict)

    @property
    def task_id(self) -> str:
        return self.task.id

    @property
    def aborted(self) -> bool:
        return self.score is None

    @property
    def passed(self) -> bool:
        return self.score is not None and self.score.total >= PASS_THRESHOLD

    def outcome(self) -> TrialOutcome:
        total = None if self.score is None else self.score.total
        return TrialOutcome(self.task.id, self.task.category, self.harness, total, self.passed)

    def record(self) -> dict[str, Any]:
        """The JSON line of ``trials.jsonl``."""
        r = self.result
        return {
            "trial_id": f"{self.task.id}#{self.harness}#{self.index}", "task_id": self.task.id,
            "category": self.task.category, "harness": self.harness, "trial": self.index,
            "status": str(r.status), "aborted": self.aborted, "fault": r.fault,
            "score": None if self.score is None else self.score.to_json(),
            "reward": r.reward, "passed": self.passed, "steps": r.steps,
            "final_answer": r.submission, "session_id": r.session_id, "seconds": r.seconds,
            "audit": self.audit, "state": self.state, "transcript": r.transcript,
            "detail": r.detail,
        }  # fmt: skip


def _wrap(harness: AnyHarness, options: ServiceOptions | None) -> TrialHarness:
    return harness if isinstance(harness, TrialHarness) else TrialHarness(harness, options)


async def run_trials(
    client: orchard.AsyncOrchard,
    harnesses: AnyHarness | Sequence[AnyHarness],
    tasks: Sequence[ClawTask],
    *,
    proxy: ModelProxyClient,
    model: str,
    k: int = 3,
    limits: Limits | None = None,
    sandbox: SandboxOptions | None = None,
    services: ServiceOptions | None = None,
    concurrency: int = 4,
    model_version: str = "",
    on_trial: Callable[[ClawTrial], None] | None = None,
) -> list[ClawTrial]:
    """``k`` trials of every task on every harness, graded; in the order (task, harness,
    trial). Harness names must differ (they key the results)."""
    if k < 1:
        raise ValueError(f"k must be at least 1, not {k}")
    given = [harnesses] if not isinstance(harnesses, Sequence) else list(harnesses)
    if not given:
        raise ValueError("run_trials: no harness")
    wrapped = [_wrap(h, services) for h in given]
    names = [h.name for h in wrapped]
    if len(set(names)) != len(names):
        raise ValueError(f"harness names repeat: {names}")
    grader = Grader(wrapped)
    jobs: list[Job] = []
    meta: list[tuple[ClawTask, str, int]] = []
    for task in tasks:
        rt = rollout_task(task)
        for h in wrapped:
            for i in range(k):
                jobs.append(Job(rt, harness=h, metadata={"trial": i, "category": task.category}))
                meta.append((task, h.name, i))

    def trial_of(index: int, result: RolloutResult) -> ClawTrial:
        task, name, i = meta[index]
        box = str(result.detail.get("sandbox_id", ""))
        score = None if result.status is Status.ABORTED else grader.scores.get(box)
        if score is None and result.status is not Status.ABORTED:  # a bug, not a fault
            result.status, result.fault = Status.ABORTED, "runner: graded trial has no score"
        evidence = grader.evidence.pop(box, {})
        return ClawTrial(task, name, i, result, score, evidence.get("audit", []),
                         evidence.get("state", {}))  # fmt: skip

    trials: dict[int, ClawTrial] = {}

    def done(index: int, result: RolloutResult) -> None:
        trials[index] = trial_of(index, result)
        if on_trial is not None:
            on_trial(trials[index])

    try:
        await run_rollouts(
            client, wrapped[0], jobs, proxy=proxy, model=model, concurrency=concurrency,
            limits=limits, grade=grader, sandbox=sandbox, model_version=model_version,
            on_result=done,
        )  # fmt: skip
    finally:
        for h in wrapped:
            if h not in given:
                await asyncio.shield(h.aclose())
    return [trials[i] for i in range(len(jobs))]


@dataclass
class TaskCheck:
    """A task's validity check: the oracle passes, a null run fails (both in real sandboxes)."""

    task: ClawTask
    oracle: ClawTrial
    null: ClawTrial

    @property
    def valid(self) -> bool:
        return self.oracle.passed and not self.null.aborted and not self.null.passed

    @property
    def why(self) -> str:
        if self.oracle.aborted or self.null.aborted:
            which = self.oracle if self.oracle.aborted else self.null
            return f"{which.harness} run aborted: {which.result.fault}"
        parts = []
        if not self.oracle.passed:
            parts.append(f"oracle scored {self._total(self.oracle)}")
        if self.null.passed:
            parts.append(f"null run passed with {self._total(self.null)}")
        return "; ".join(parts) or "valid"

    @staticmethod
    def _total(trial: ClawTrial) -> float | None:
        return None if trial.score is None else trial.score.total


async def check_tasks(
    client: orchard.AsyncOrchard,
    tasks: Sequence[ClawTask],
    *,
    proxy: ModelProxyClient,
    sandbox: SandboxOptions | None = None,
    services: ServiceOptions | None = None,
    concurrency: int = 4,
) -> list[TaskCheck]:
    """Run the oracle and a null run of every task once; which are valid and why not."""
    from .baselines import NullHarness, OracleHarness

    trials = await run_trials(
        client, [OracleHarness(), NullHarness()], tasks, proxy=proxy, model="none", k=1,
        sandbox=sandbox, services=services, concurrency=concurrency,
    )  # fmt: skip
    by: Mapping[tuple[str, str], ClawTrial] = {(t.task_id, t.harness): t for t in trials}
    return [TaskCheck(t, by[(t.id, "oracle")], by[(t.id, "null")]) for t in tasks]
