"""The GUI runner: GUI tasks -> rollouts (``orchard.rollouts.run_rollouts``) -> format x judge.

Each rollout is one browser sandbox (:func:`~orchard.recipes.gui.browser.browser_sandbox_options`:
the browser image, network ``none``, memory-capped) running :class:`~orchard.recipes.gui.agent.GuiAgent`.
The reward is computed in the runner's ``grade`` hook (:func:`~orchard.recipes.gui.reward.episode_reward`),
so ``run_rollouts`` attaches it to the proxy session (``finish``) before the samples are read
back: the samples carry it. A judge that gives no verdict raises in the hook, which the
rollout runner turns into an ABORTED rollout with fault ``grade: JudgeFailed: ...``: the
session is finished with fault ``infrastructure`` and its samples are not trainable. That is
the drop the recipe asks for (never a zero reward), and it is told apart from a browser or
sandbox fault by its phase.

Why the hook and not grading after the rollout as the SWE runner does: the SWE grader needs
a fresh sandbox of its own for minutes; the judge needs only what the agent saw (the run's
episode), one HTTP call, so holding the browser sandbox for it costs seconds.

:func:`run_round` is one training round: tasks drawn by the success-weighted sampler
(:mod:`~orchard.recipes.gui.sampling`), the step budget from the curriculum
(:mod:`~orchard.recipes.gui.curriculum`), both updated with the round's graded outcomes.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import orchard
from orchard.rollouts import (
    Harness,
    HarnessRun,
    Job,
    Limits,
    ModelProxyClient,
    RolloutResult,
    SandboxOptions,
    Status,
    Task,
    run_rollouts,
)

from . import miniwob
from .agent import GuiRun
from .browser import browser_sandbox_options
from .curriculum import StepCurriculum
from .judge import EpisodeJudge, JudgeFailed
from .reward import RewardRule, episode_reward
from .sampling import SuccessSampler
from .tasks import GuiTask

ROLLOUT_KEY = "rollout"
"""``Task.metadata`` key: the rollout's id (``<task id>#<sample>``), set per job."""


def rollout_task(task: GuiTask, seed: int | None = None) -> Task:
    """The rollout task of a GUI task: a MiniWoB episode (``miniwob.rollout_task``, by name and
    seed) or a web page (``metadata["url"]``, the instruction as the prompt)."""
    if task.kind == "miniwob" and task.miniwob is not None:
        base = miniwob.rollout_task(task.miniwob, seed)
        return dataclasses.replace(base, id=task.id, metadata={**base.metadata, "site": task.site})
    return Task(
        id=task.id, prompt=task.instruction, workdir="/tmp",
        metadata={"url": task.website, "site": task.site},
    )  # fmt: skip


@dataclass(frozen=True)
class GuiOptions:
    samples_per_task: int = 1
    concurrency: int = 4
    model_version: str = ""
    rule: RewardRule = field(default_factory=RewardRule)
    seed_base: int | None = 0
    """MiniWoB seed of a task's sample s: ``seed_base + s`` (None: the page's own randomness)."""


@dataclass
class GuiRollout:
    """One rollout, its reward and how the reward was reached."""

    rollout_id: str
    sample: int
    result: RolloutResult
    reward_detail: dict[str, Any] = field(default_factory=dict)
    screenshots: list[tuple[int, bytes]] = field(default_factory=list)

    @property
    def reward(self) -> float | None:
        return self.result.reward

    @property
    def dropped(self) -> str | None:
        """Why the sample was dropped (the judge failed), or None."""
        r = self.result
        return r.fault if r.status is Status.ABORTED and r.fault_phase == "grade" else None

    def record(self) -> dict[str, Any]:
        """The JSON line of ``rollouts.jsonl``."""
        r = self.result
        harness = dict(r.detail.get("harness") or {})
        return {
            "rollout_id": self.rollout_id, "task_id": r.task_id, "sample": self.sample,
            "harness": r.harness, "status": str(r.status), "steps": r.steps,
            "reward": r.reward, "dropped": self.dropped, "fault": r.fault,
            "session_id": r.session_id, "seconds": r.seconds, "submission": r.submission,
            "reward_detail": self.reward_detail,
            "truth_success": harness.get("truth_success"),
            "task_reward": harness.get("task_reward"), "detail": r.detail,
            "transcript": r.transcript,
        }  # fmt: skip


class Grader:
    """The ``grade`` hook: the episode reward, its detail kept per rollout id."""

    def __init__(self, judge: EpisodeJudge, rule: RewardRule) -> None:
        self.judge, self.rule = judge, rule
        self.details: dict[str, dict[str, Any]] = {}
        self.screenshots: dict[str, list[tuple[int, bytes]]] = {}

    async def __call__(self, sandbox: orchard.AsyncSandbox, task: Task, run: HarnessRun) -> float:
        key = str(task.metadata.get(ROLLOUT_KEY, task.id))
        if not isinstance(run, GuiRun) or run.episode is None:
            raise TypeError(
                f"the GUI grader needs a GuiRun with an episode, got {type(run).__name__}"
            )
        self.screenshots[key] = list(run.episode.screenshots)
        detail = dict(run.detail)
        truth = detail.get("truth_success")
        try:
            reward, how = await episode_reward(
                run.episode, stop_reason=str(detail.get("stop_reason")),
                malformed_turns=int(detail.get("malformed_turns", 0)),
                last_turn_ok=bool(detail.get("last_turn_ok")), judge=self.judge, rule=self.rule,
            )  # fmt: skip
        except JudgeFailed as err:
            self.details[key] = {"judge_failed": str(err), "truth_success": truth}
            raise
        self.details[key] = {**how, "truth_success": truth, "reward": reward}
        return reward


async def run_gui(
    client: orchard.AsyncOrchard,
    harness: Harness,
    tasks: Sequence[GuiTask],
    *,
    proxy: ModelProxyClient,
    model: str,
    judge: EpisodeJudge,
    limits: Limits | None = None,
    options: GuiOptions | None = None,
    sandbox: SandboxOptions | None = None,
    on_result: Callable[[GuiRollout], None] | None = None,
    prefix: str = "",
) -> list[GuiRollout]:
    """``samples_per_task`` rollouts of every task, rewarded; in the order (task, sample).
    Rollout ids are ``<prefix><task id>#<sample>`` (a training round's prefix: ``r3/``)."""
    options = options or GuiOptions()
    jobs: list[Job] = []
    seen: dict[str, int] = {}
    for gui in tasks:  # a task listed twice gets the next sample numbers (and seeds)
        for _ in range(options.samples_per_task):
            s = seen.get(gui.id, 0)
            seen[gui.id] = s + 1
            seed = None if options.seed_base is None else options.seed_base + s
            base = rollout_task(gui, seed)
            key = f"{prefix}{gui.id}#{s}"
            task = dataclasses.replace(base, metadata={**base.metadata, ROLLOUT_KEY: key})
            jobs.append(Job(task, metadata={"sample": s, "rollout": key}))
    grader = Grader(judge, options.rule)
    out: dict[int, GuiRollout] = {}

    def done(index: int, result: RolloutResult) -> None:
        job = jobs[index]
        key = str(job.task.metadata[ROLLOUT_KEY])
        rollout = GuiRollout(
            key, int((job.metadata or {})["sample"]), result,
            grader.details.pop(key, {}), grader.screenshots.pop(key, []),
        )  # fmt: skip
        out[index] = rollout
        if on_result is not None:
            on_result(rollout)

    await run_rollouts(
        client, harness, jobs, proxy=proxy, model=model, concurrency=options.concurrency,
        limits=limits, grade=grader, sandbox=sandbox or browser_sandbox_options(),
        model_version=options.model_version, on_result=done,
    )  # fmt: skip
    return [out[i] for i in range(len(jobs))]


def success_of(rollout: GuiRollout) -> bool | None:
    """A graded rollout's outcome for the sampler and the curriculum (None: not graded)."""
    return None if rollout.reward is None else rollout.reward > 0


@dataclass
class RoundResult:
    round: int
    budget: int
    drawn: list[str]
    rollouts: list[GuiRollout]
    successes: int
    graded: int
    switched: bool

    def as_dict(self) -> dict[str, Any]:
        return {"round": self.round, "budget": self.budget, "drawn": self.drawn,
                "successes": self.successes, "graded": self.graded,
                "switched": self.switched}  # fmt: skip


async def run_round(
    number: int,
    client: orchard.AsyncOrchard,
    harness: Harness,
    tasks: Mapping[str, GuiTask],
    *,
    sampler: SuccessSampler,
    curriculum: StepCurriculum,
    batch: int,
    proxy: ModelProxyClient,
    model: str,
    judge: EpisodeJudge,
    limits: Limits,
    options: GuiOptions | None = None,
    sandbox: SandboxOptions | None = None,
    on_result: Callable[[GuiRollout], None] | None = None,
) -> RoundResult:
    """One round: ``batch`` tasks drawn by success, run at the curriculum's step budget."""
    options = options or GuiOptions()
    budget = curriculum.budget
    drawn = sampler.sample(batch)
    picked = [tasks[t] for t in drawn]
    seeded = dataclasses.replace(
        options, samples_per_task=1,
        seed_base=None if options.seed_base is None else options.seed_base + number * batch,
    )  # fmt: skip
    rollouts = await run_gui(
        client, harness, picked, proxy=proxy, model=model, judge=judge,
        limits=dataclasses.replace(limits, max_steps=budget), options=seeded,
        sandbox=sandbox, on_result=on_result, prefix=f"r{number}/",
    )  # fmt: skip
    outcomes = [(r.result.task_id, success_of(r)) for r in rollouts]
    graded = [(t, s) for t, s in outcomes if s is not None]
    for task_id, success in graded:
        sampler.update(task_id, success)
    wins = sum(1 for _, s in graded if s)
    switched = curriculum.record(wins, len(graded))
    return RoundResult(number, budget, drawn, rollouts, wins, len(graded), switched)
