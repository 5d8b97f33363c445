"""The rollout contract: what a harness is given, what it returns, what a rollout yields.

A rollout is "run harness H on task T in a fresh sandbox with model endpoint M". The runner
(``orchard.rollouts.run_rollout`` / ``run_rollouts``) owns the sandbox and the model-proxy
session; a harness owns only what happens between "the task is in place" and "the agent
stopped". Both the real harness CLIs of the tools layer (Codex, Claude Code, OpenClaw,
mini-swe-agent, aider: they run inside the sandbox and call the proxy from there) and the
recipes' built-in loops (they run in the driver's process, call the proxy from the host and
the sandbox through the SDK) implement :class:`Harness`, so the recipes' runners take either.

Outcome statuses are kept apart on purpose: COMPLETED (the agent finished, whatever its
reward), TRUNCATED (a step, time or token limit stopped it: a task outcome, it is graded),
ABORTED (infrastructure: the sandbox, the harness install or start, the proxy or the model
endpoint failed; never graded, never a zero reward).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from orchard import AsyncSandbox


class Status(enum.StrEnum):
    COMPLETED = "completed"
    TRUNCATED = "truncated"
    ABORTED = "aborted"


@dataclass(frozen=True)
class Limits:
    """What stops an agent: steps (model calls), wall time, tokens, per-command output kept."""

    max_steps: int = 50
    max_seconds: float = 1800.0
    max_tokens: int | None = None
    command_timeout: float = 120.0
    output_head_bytes: int = 10_000
    output_tail_bytes: int = 10_000


@dataclass(frozen=True)
class Task:
    """A task as the runner sees it, whatever the recipe or dataset it came from.

    ``files`` are written into the sandbox before ``setup`` runs (paths absolute); ``workdir``
    is the repository or working folder the agent starts in and whose ``git diff`` is the
    rollout's final diff (empty when it is not a git repository).
    """

    id: str
    prompt: str
    image: str | None = None
    workdir: str = "/testbed"
    files: Mapping[str, bytes] = field(default_factory=dict)
    setup: Sequence[str] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    metadata: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class ModelEndpoint:
    """One rollout's model session on the recording proxy.

    ``openai_base_url`` / ``anthropic_base_url`` carry the session credential in the path;
    ``*_in_sandbox`` are the same URLs as a process inside the sandbox reaches them (they
    differ from the host's when the proxy is reached through the sandbox's own endpoint).
    """

    session_id: str
    model: str
    openai_base_url: str
    anthropic_base_url: str
    openai_base_url_in_sandbox: str
    anthropic_base_url_in_sandbox: str


@dataclass
class HarnessRun:
    """What a harness reports when the agent stopped."""

    status: Status
    steps: int = 0
    submission: str | None = None
    transcript: Any = None
    fault: str | None = None
    detail: Mapping[str, Any] = field(default_factory=dict)


class Harness(Protocol):
    """An agent that works one task in a sandbox prepared by the runner.

    ``needs_tools_layer``: the runner mounts the tools layer (the harness CLIs) into the
    sandbox. ``run`` must not raise for a task outcome (a wrong answer, a limit): it returns
    a :class:`HarnessRun`; an exception (or ``Status.ABORTED``) means an infrastructure fault.
    """

    name: str
    needs_tools_layer: bool

    async def run(
        self, sandbox: AsyncSandbox, task: Task, model: ModelEndpoint, limits: Limits
    ) -> HarnessRun: ...


@dataclass
class RolloutResult:
    """One rollout: outcome, what the harness said, the diff, the recorded samples, the reward."""

    task_id: str
    harness: str
    status: Status
    steps: int
    diff: str
    transcript: Any
    samples: list[dict[str, Any]]
    session_id: str | None
    reward: float | None = None
    fault: str | None = None
    submission: str | None = None
    seconds: float = 0.0
    detail: dict[str, Any] = field(default_factory=dict)

    @property
    def fault_phase(self) -> str | None:
        """The phase a fault came from (``fault`` reads ``"<phase>: <what failed>"``):
        ``proxy``, ``sandbox``, ``tools``, ``setup``, ``harness``, ``grade`` or ``runner``."""
        return self.fault.split(":", 1)[0] if self.fault else None
