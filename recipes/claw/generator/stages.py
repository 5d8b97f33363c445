"""The loop's stages, each usable on its own: propose, build, revise, validate, solve.

Every model stage is one conversation on the recording proxy (:mod:`.model`) and returns
what it produced together with its :class:`~.model.Usage` (the proxy's records) and wall
time. The sandbox stages run trials through the :class:`~.backend.TaskBackend`.

A build or revise reply goes through the same gate (:func:`_written_task`): one bounded JSON
object (:func:`.replies.json_object`), the idea's id, then the backend's parser. A reply that
fails the gate is answered in the same conversation with the error
(:data:`.prompts.REPAIR_TEMPLATE`), at most ``attempts`` replies in all; the errors of every
attempt are kept (the manifest lists them).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import Any

from . import prompts
from .acceptance import Verdict, judge
from .backend import InvalidTask, TaskBackend, Trial
from .ideas import Idea, RejectedIdea, read_ideas
from .model import GenerationModel, Usage
from .replies import MalformedReply, json_object

MAX_EXISTING_SHOWN = 500
"""At most this many existing ids are quoted in the propose prompt (the rest still count)."""


@dataclass
class Proposal:
    ideas: list[Idea]
    rejected: list[RejectedIdea]
    usage: Usage
    seconds: float
    error: str | None = None
    """Set when the reply was not the ideas shape at all (no idea taken)."""
    conversation: Any = field(default=None, repr=False)


@dataclass
class Written:
    """A build or revise: the task (None if every attempt failed), its JSON, the errors."""

    stage: str
    task: Any
    data: dict[str, Any] | None
    errors: list[str]
    usage: Usage
    seconds: float
    conversation: Any = field(default=None, repr=False)


@dataclass
class Validation:
    oracle: Trial
    null: Trial
    verdict: Verdict
    seconds: float

    def as_dict(self) -> dict[str, Any]:
        return {"oracle": self.oracle.as_dict(), "null": self.null.as_dict(),
                "verdict": self.verdict.reason, "feedback": self.verdict.feedback,
                "seconds": round(self.seconds, 3)}  # fmt: skip


async def propose(
    model: GenerationModel,
    backend: TaskBackend,
    *,
    category: str,
    count: int,
    existing: Collection[str],
) -> Proposal:
    began = time.monotonic()
    shown = sorted(existing)[:MAX_EXISTING_SHOWN]
    text = prompts.PROPOSE_TEMPLATE.format(
        count=count, category=category, capabilities=backend.capabilities(),
        existing="\n".join(shown) if shown else "(none)",
    )  # fmt: skip
    async with model.conversation("propose", {"category": category}) as talk:
        reply = await talk.ask(text)
    try:
        ideas, rejected = read_ideas(
            json_object(reply), category=category, services=backend.services(),
            existing=existing, limit=count,
        )  # fmt: skip
    except MalformedReply as err:
        return Proposal([], [], talk.usage, time.monotonic() - began, str(err), talk)
    return Proposal(ideas, rejected, talk.usage, time.monotonic() - began, None, talk)


def _written_task(backend: TaskBackend, idea: Idea, reply: str) -> tuple[Any, dict[str, Any]]:
    data = json_object(reply)
    if data.get("id") != idea.id:
        raise InvalidTask(f'the task\'s "id" must be "{idea.id}", not {data.get("id")!r:.80}')
    if data.get("category") != idea.category:
        raise InvalidTask(
            f'the task\'s "category" must be "{idea.category}", not {data.get("category")!r:.80}'
        )
    return backend.parse(data), data


async def _write(
    model: GenerationModel, backend: TaskBackend, idea: Idea, stage: str, first: str,
    attempts: int,
) -> Written:  # fmt: skip
    began = time.monotonic()
    errors: list[str] = []
    task, data = None, None
    async with model.conversation(stage, {"idea": idea.id}) as talk:
        message = first
        for _ in range(attempts):
            reply = await talk.ask(message)
            try:
                task, data = _written_task(backend, idea, reply)
                break
            except (MalformedReply, InvalidTask) as err:
                errors.append(f"{type(err).__name__}: {err}")
                message = prompts.REPAIR_TEMPLATE.format(error=err)
    return Written(stage, task, data, errors, talk.usage, time.monotonic() - began, talk)


def _idea_text(idea: Idea) -> str:
    return json.dumps(idea.as_dict(), indent=2, ensure_ascii=False)


async def build(
    model: GenerationModel, backend: TaskBackend, idea: Idea, *, attempts: int = 3
) -> Written:
    """The model writes the task for ``idea``; repaired with the error, ``attempts`` replies."""
    first = prompts.BUILD_TEMPLATE.format(id=idea.id, category=idea.category, idea=_idea_text(idea))
    return await _write(model, backend, idea, "build", first, attempts)


async def revise(
    model: GenerationModel,
    backend: TaskBackend,
    idea: Idea,
    task_data: Mapping[str, Any],
    feedback: str,
    *,
    attempts: int = 3,
) -> Written:
    """The model rewrites a task that failed validation, given the feedback."""
    first = prompts.REVISE_TEMPLATE.format(
        feedback=feedback, idea=_idea_text(idea), id=idea.id, category=idea.category,
        task=json.dumps(task_data, indent=2, ensure_ascii=False),
    )  # fmt: skip
    return await _write(model, backend, idea, "revise", first, attempts)


async def validate(backend: TaskBackend, task: Any) -> Validation:
    """The oracle run and the null run in real sandboxes (at once), and the verdict."""
    began = time.monotonic()
    oracle, null = await asyncio.gather(backend.trial(task, "oracle"), backend.trial(task, "null"))
    verdict = judge(oracle, null, backend.pass_threshold)
    return Validation(oracle, null, verdict, time.monotonic() - began)


async def solve(backend: TaskBackend, task: Any, trials: int) -> list[Trial]:
    """``trials`` model attempts through the ReAct loop: how hard the task is."""
    return [await backend.trial(task, "solve") for _ in range(trials)]
