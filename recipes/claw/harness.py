"""The contract of a Claw harness that runs in the driver's process and is given the task's
services: the ReAct loop (:mod:`.react`), the oracle and the null run (:mod:`.baselines`).

Any ``orchard.rollouts.Harness`` works with the runner too (a CLI of the tools layer inside
the sandbox); a :class:`ClawHarness` says ``run_claw`` instead of ``run``, and is handed one
:class:`TrialContext` with everything a trial gives it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from orchard.rollouts import Harness, HarnessRun, Limits, ModelEndpoint

from .tasks import ClawTask

if TYPE_CHECKING:
    from orchard import AsyncSandbox

    from .services import ClawServices


@dataclass(frozen=True)
class TrialContext:
    """One trial as a driver-side harness sees it: the sandbox, the task, its running
    services (None: the task has none), the model session's endpoint and the limits."""

    sandbox: AsyncSandbox
    task: ClawTask
    services: ClawServices | None
    model: ModelEndpoint
    limits: Limits


class ClawHarness(Protocol):
    """A harness given the task's services (a loop in the driver's process)."""

    name: str
    needs_tools_layer: bool

    async def run_claw(self, trial: TrialContext) -> HarnessRun: ...


AnyHarness = Harness | ClawHarness
"""What the runner takes: a Claw harness or any rollouts harness."""
