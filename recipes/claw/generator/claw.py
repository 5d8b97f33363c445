"""The generator's :class:`~.backend.TaskBackend` over the Claw recipe itself.

The format is :class:`.taskformat.ClawFormat`'s; the trials are the recipe's runner's
(``orchard.recipes.claw.runner.run_trials``): the oracle harness, the null harness (the agent
does nothing) and the ReAct loop (``orchard.recipes.claw.react``), each in a fresh sandbox
with the task's mock services, graded by the recipe's grader. A rollout's fault in the
``setup`` or ``grade`` phase is the task's (revisable); any other is the infrastructure's.
The sandbox seconds of a trial are its rollout's phases but the proxy's (session, finish,
samples); a solve trial's tokens are its proxy session's records.
"""

from __future__ import annotations

from typing import Any

from orchard.recipes.claw.baselines import NullHarness, OracleHarness
from orchard.recipes.claw.react import ReactHarness
from orchard.recipes.claw.runner import run_trials
from orchard.recipes.claw.tasks import ClawTask

from orchard import AsyncOrchard
from orchard.rollouts import Limits, ModelProxyClient, ProxyError, SandboxOptions

from .backend import Trial
from .model import Usage, usage_of_records
from .taskformat import ClawFormat

TASK_PHASES = frozenset({"setup", "grade"})
"""The fault phases of a rollout that are the task's doing (its setup failed, its grader
raised); every other phase (proxy, sandbox, tools, harness, runner) is the infrastructure's."""
NOT_SANDBOX_PHASES = frozenset({"session", "finish", "samples"})
MAX_CHECK_TEXT = 300


def _checks(score: Any) -> list[str]:
    lines = []
    for component in score.components:
        for result in component.checks:
            found = f" (found: {result.found})" if result.found else ""
            line = f"[{component.name}] {'held' if result.ok else 'failed'}: {result.check}{found}"
            lines.append(line[:MAX_CHECK_TEXT])
    return lines


class ClawBackend(ClawFormat):
    """The format, plus trials through the recipe's runner: one sandbox per trial.

    ``solver_model`` is what the ReAct loop asks the proxy for; ``limits`` the solve stage's
    (the oracle and null harnesses make no model calls). ``aclose()`` when done.
    """

    def __init__(
        self,
        client: AsyncOrchard,
        proxy: ModelProxyClient,
        *,
        solver_model: str,
        limits: Limits | None = None,
        sandbox: SandboxOptions | None = None,
        ca: str | None = None,
    ) -> None:
        self.client, self.proxy = client, proxy
        self.solver_model = solver_model
        self.limits = limits or Limits(max_steps=30, max_seconds=600.0)
        self.sandbox = sandbox
        self.harnesses: dict[str, Any] = {
            "oracle": OracleHarness(),
            "null": NullHarness(),
            "solve": ReactHarness(ca=ca),
        }

    async def aclose(self) -> None:
        for harness in self.harnesses.values():
            close = getattr(harness, "aclose", None)
            if close is not None:
                await close()

    async def trial(self, task: ClawTask, kind: str) -> Trial:
        if kind not in self.harnesses:
            raise ValueError(f"no trial of kind {kind!r}")
        (done,) = await run_trials(
            self.client, self.harnesses[kind], [task], proxy=self.proxy,
            model=self.solver_model, k=1, limits=self.limits, sandbox=self.sandbox,
            concurrency=1,
        )  # fmt: skip
        result = done.result
        phases = result.detail.get("phases", {})
        sandbox_seconds = sum(v for k, v in phases.items() if k not in NOT_SANDBOX_PHASES)
        usage = Usage()
        if kind == "solve" and result.session_id:
            try:
                usage = usage_of_records(await self.proxy.calls(result.session_id))
            except ProxyError as err:
                return Trial(kind, None, False, str(result.status), f"proxy: calls: {err}",
                             sandbox_seconds=sandbox_seconds)  # fmt: skip
        if done.aborted or done.score is None:
            fault = result.fault or "the trial was not graded"
            return Trial(kind, None, False, str(result.status), fault,
                         fault_is_task=result.fault_phase in TASK_PHASES,
                         sandbox_seconds=sandbox_seconds, usage=usage)  # fmt: skip
        score = done.score
        refused = result.detail.get("harness", {}).get("oracle_errors") or []
        notes = [f"the services refused an oracle call: {e}"[:MAX_CHECK_TEXT] for e in refused]
        return Trial(
            kind, score.total, score.passed, str(result.status),
            components={c.name: c.score for c in score.components},
            safety=[v.rule for v in score.violations], checks=notes + _checks(score),
            sandbox_seconds=sandbox_seconds, usage=usage,
        )  # fmt: skip
