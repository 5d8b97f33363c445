"""The generation loop: propose -> build -> validate -> (revise -> validate)* -> solve -> keep.

:func:`generate` runs ``options.proposals`` proposals of ``options.ideas`` ideas each
(every proposal is told the ids taken so far, the existing tasks' and the earlier
proposals'), and :func:`develop` takes each accepted idea through the stages:

1. **build**: the model writes the task (bounded repairs of a malformed or invalid one);
2. **validate**: the oracle run and a null run in real sandboxes (:mod:`.acceptance`);
3. **revise** while the verdict is revisable and rounds are left (``revise_rounds``): the
   model rewrites the task from the feedback, and it is validated again;
4. **solve**: a kept task is attempted ``solve_trials`` times by a model through the
   ReAct loop; the scores say how hard it is (they do not decide keeping).

Every idea ends as one :class:`Outcome`: kept, or rejected with a reason code (the ideas'
``invalid_idea`` / ``duplicate`` / ``over_limit``, ``malformed`` when no attempt wrote a
valid task, the verdicts of :mod:`.acceptance`, ``model_error`` when the model endpoint
failed, ``generator_error`` for a bug: one idea's, logged, the others go on), and what it
cost (:mod:`.costs`). Each generation session is finished with a
reward for the generator's own training: 1.0 for the conversation whose task was kept, 0.0
for the others; a proposal's is the share of its ideas kept.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Any

from .backend import TaskBackend, Trial
from .costs import TaskCost, shares, summarise
from .ideas import Idea, RejectedIdea
from .model import GenerationModel, GenerationModelError, Usage
from .stages import Proposal, Validation, Written, build, propose, revise, solve, validate

log = logging.getLogger("orchard.recipes.claw.generator")


@dataclass(frozen=True)
class GeneratorOptions:
    category: str
    ideas: int = 3
    """Ideas asked for per proposal."""
    proposals: int = 1
    build_attempts: int = 3
    """Replies per build or revise (the first and its repairs)."""
    revise_rounds: int = 2
    """Revisions after a failed validation, at most."""
    solve_trials: int = 1
    concurrency: int = 2
    """Ideas developed at once (each holds up to one sandbox at a time)."""

    def __post_init__(self) -> None:
        for name in ("ideas", "proposals", "build_attempts", "concurrency"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1")
        for name in ("revise_rounds", "solve_trials"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must not be negative")


@dataclass
class Outcome:
    id: str
    category: str
    kept: bool
    reason: str
    detail: str = ""
    idea: Idea | None = None
    writes: list[Written] = field(default_factory=list)
    validations: list[Validation] = field(default_factory=list)
    solves: list[Trial] = field(default_factory=list)
    cost: TaskCost = field(default_factory=TaskCost)
    task: dict[str, Any] | None = None

    @property
    def solve_score(self) -> float | None:
        scores = [t.score for t in self.solves if t.score is not None]
        return sum(scores) / len(scores) if scores else None

    def row(self) -> dict[str, Any]:
        """The manifest line."""
        return {
            "id": self.id, "category": self.category, "kept": self.kept, "reason": self.reason,
            "detail": self.detail, "idea": self.idea.as_dict() if self.idea else None,
            "revisions": sum(1 for w in self.writes if w.stage == "revise"),
            "writes": [{"stage": w.stage, "valid": w.task is not None, "errors": w.errors,
                        "session_id": w.conversation.session.id if w.conversation else None}
                       for w in self.writes],
            "validations": [v.as_dict() for v in self.validations],
            "solve": {"trials": [t.as_dict() for t in self.solves],
                      "mean_score": self.solve_score,
                      "passed": sum(1 for t in self.solves if t.passed)},
            "cost": self.cost.as_dict(),
        }  # fmt: skip


@dataclass
class Report:
    outcomes: list[Outcome]
    proposals: list[Proposal]
    unattributed: dict[str, Usage]

    @property
    def kept(self) -> list[Outcome]:
        return [o for o in self.outcomes if o.kept]

    def summary(self) -> dict[str, Any]:
        reasons: dict[str, int] = {}
        for o in self.outcomes:
            reasons[o.reason] = reasons.get(o.reason, 0) + 1
        solved = [o.solve_score for o in self.kept if o.solve_score is not None]
        return {
            "ideas": len(self.outcomes),
            "kept": len(self.kept),
            "reasons": dict(sorted(reasons.items())),
            "proposal_errors": [p.error for p in self.proposals if p.error],
            "mean_solve_score": sum(solved) / len(solved) if solved else None,
            "cost": summarise(((o.kept, o.cost) for o in self.outcomes), self.unattributed),
        }


async def _finish_sessions(outcome: Outcome) -> None:
    for written in outcome.writes:
        if written.conversation is None:
            continue
        kept = outcome.kept and written is outcome.writes[-1]
        await written.conversation.close(1.0 if kept else 0.0)


async def develop(
    model: GenerationModel, backend: TaskBackend, idea: Idea, options: GeneratorOptions,
    propose_share: Usage | None = None,
) -> Outcome:  # fmt: skip
    """One idea through build, validate, revise and solve; never raises (the outcome says
    what went wrong, a bug included: ``generator_error``, logged with its traceback)."""
    began = time.monotonic()
    outcome = Outcome(idea.id, idea.category, False, "malformed", idea=idea)
    if propose_share is not None:
        outcome.cost.add("propose", propose_share)
    try:
        await _develop(model, backend, idea, options, outcome)
        await _finish_sessions(outcome)
    except GenerationModelError as err:
        outcome.kept, outcome.reason, outcome.detail = False, "model_error", str(err)
    except Exception as err:  # a bug (ours or the backend's): this idea's, no other's
        log.exception("generator: idea %s failed", idea.id)
        outcome.kept, outcome.reason = False, "generator_error"
        outcome.detail = f"{type(err).__name__}: {err}"[:2000]
    outcome.cost.wall_seconds = time.monotonic() - began
    return outcome


async def _develop(
    model: GenerationModel, backend: TaskBackend, idea: Idea, options: GeneratorOptions,
    outcome: Outcome,
) -> None:  # fmt: skip
    written = await build(model, backend, idea, attempts=options.build_attempts)
    while True:
        outcome.writes.append(written)
        outcome.cost.add(written.stage, written.usage)
        if written.task is None or written.data is None:
            outcome.reason = "malformed"
            outcome.detail = f"{written.stage}: no valid task in {len(written.errors)} replies"
            return
        validation = await validate(backend, written.task)
        outcome.validations.append(validation)
        outcome.cost.sandbox_seconds += (
            validation.oracle.sandbox_seconds + validation.null.sandbox_seconds
        )
        verdict = validation.verdict
        if verdict.kept:
            break
        revisions = sum(1 for w in outcome.writes if w.stage == "revise")
        if not verdict.revisable or revisions >= options.revise_rounds:
            outcome.reason, outcome.detail = verdict.reason, verdict.feedback
            return
        written = await revise(model, backend, idea, written.data, verdict.feedback,
                               attempts=options.build_attempts)  # fmt: skip
    outcome.kept, outcome.reason = True, "kept"
    outcome.task = backend.to_json(written.task)
    outcome.solves = await solve(backend, written.task, options.solve_trials)
    for trial in outcome.solves:
        outcome.cost.add("solve", trial.usage)
        outcome.cost.sandbox_seconds += trial.sandbox_seconds


def _rejected(idea: RejectedIdea, category: str) -> Outcome:
    return Outcome(idea.id, category, False, idea.code, idea.reason)


async def generate(
    model: GenerationModel,
    backend: TaskBackend,
    options: GeneratorOptions,
    existing: Collection[str] = (),
) -> Report:
    """Run the loop; the report holds every idea's outcome (kept and rejected)."""
    taken = set(existing)
    report = Report([], [], {"propose": Usage()})
    gate = asyncio.Semaphore(options.concurrency)

    async def one(idea: Idea, share: Usage) -> Outcome:
        async with gate:
            return await develop(model, backend, idea, options, share)

    for _ in range(options.proposals):
        try:
            proposal = await propose(model, backend, category=options.category,
                                     count=options.ideas, existing=taken)  # fmt: skip
        except GenerationModelError as err:
            report.proposals.append(Proposal([], [], Usage(), 0.0, f"model_error: {err}"))
            continue
        report.proposals.append(proposal)
        report.outcomes += [_rejected(r, options.category) for r in proposal.rejected]
        if not proposal.ideas:
            report.unattributed["propose"].add(proposal.usage)
            continue
        taken.update(i.id for i in proposal.ideas)
        split = shares(proposal.usage, len(proposal.ideas))
        developed = await asyncio.gather(
            *(one(i, s) for i, s in zip(proposal.ideas, split, strict=True))
        )
        report.outcomes += developed
        kept = sum(1 for o in developed if o.kept)
        try:
            await proposal.conversation.close(kept / len(developed))
        except GenerationModelError as err:
            proposal.error = f"model_error: reward not recorded: {err}"
    return report
