"""What the generator needs of the Claw recipe: the task format and real trial runs.

The generator does not know the task format or how a trial runs; it is given a
:class:`TaskBackend`: parse a task the model wrote (a JSON object) into a task or raise
:class:`InvalidTask` with a sentence the model can act on, turn a task back into JSON, say
what the format and the services are (the build and propose prompts quote it), and run one
trial of a task in a real sandbox: the task's oracle solution, a *null* run (the agent does
nothing), or a model's attempt through the ReAct loop. :mod:`.claw` is the implementation
over the recipe's own format, grader, runner and services.

A :class:`Trial` is what one run scored; ``fault`` is set when the run did not get graded,
and ``fault_is_task`` tells the task's fault (its fixtures or setup broke, its grader raised:
the model can fix it in a revision) from the infrastructure's (a sandbox or the proxy
failed: nobody's task is judged on that).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from .model import Usage

TRIAL_KINDS = ("oracle", "null", "solve")


class InvalidTask(ValueError):
    """A task the model wrote does not satisfy the format; the message says what to fix."""


@dataclass
class Trial:
    """One run of a task: its kind, score, pass, and what it cost."""

    kind: str
    score: float | None
    passed: bool
    status: str = "completed"
    fault: str | None = None
    fault_is_task: bool = False
    components: Mapping[str, float] = field(default_factory=dict)
    """The grader's components (name -> score), for the revision feedback."""
    safety: list[str] = field(default_factory=list)
    """The safety checks that fired (destructive or unrequested actions)."""
    checks: list[str] = field(default_factory=list)
    """Each check's outcome as a line (``held`` / ``failed``: what it asked, what was found),
    so the revision feedback says which checks the oracle missed or the null run met."""
    sandbox_seconds: float = 0.0
    usage: Usage = field(default_factory=Usage)
    """The model calls of the run (a solve run's; zero for oracle and null)."""

    def as_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "score": self.score, "passed": self.passed,
                "status": self.status, "fault": self.fault, "fault_is_task": self.fault_is_task,
                "components": dict(self.components), "safety": list(self.safety),
                "checks": list(self.checks),
                "sandbox_seconds": round(self.sandbox_seconds, 3),
                "usage": self.usage.as_dict()}  # fmt: skip


class TaskBackend(Protocol):
    """The task format and the trial runs the generator is built over."""

    pass_threshold: float
    """A trial passes at a score at or above this (the recipe's 0.75)."""

    def services(self) -> Collection[str]:
        """The services a task may use (names)."""
        ...

    def capabilities(self) -> str:
        """What each service offers the agent and what its fixtures hold (for the prompts)."""
        ...

    def format_reference(self) -> str:
        """The task format as the build prompt states it (fields, grader spec, an example)."""
        ...

    def parse(self, data: Mapping[str, Any]) -> Any:
        """The task ``data`` describes; :class:`InvalidTask` when it is not a valid task."""
        ...

    def to_json(self, task: Any) -> dict[str, Any]:
        """``task`` as the JSON object the runner loads."""
        ...

    def task_id(self, task: Any) -> str: ...

    async def trial(self, task: Any, kind: str) -> Trial:
        """Run ``task`` once in a fresh sandbox: ``oracle``, ``null`` or ``solve``."""
        ...
