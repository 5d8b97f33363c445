"""The check: every claw-bench task's reference solution and a null run, through the Claw runner.

The tasks become Claw tasks (:func:`.convert.to_claw_task`) and go through
:func:`orchard.recipes.claw.runner.check_tasks`: the oracle (``solve.sh``) and the null run,
each in a fresh sandbox of the default image with network ``none``, each graded by the task's
verifier as the runner grades any script-graded task. :func:`.triage.judge` turns each pair
into the task's verdict; tasks that are not even readable are refused as ``malformed``. Tasks
are checked in batches of :data:`BATCH` so that verdicts print as they come.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import orchard
from orchard.rollouts import ModelProxyClient, SandboxOptions

from ..runner import check_tasks
from .convert import to_claw_task
from .source import BenchTask, Catalogue
from .triage import Verdict, judge

BATCH = 16


@dataclass
class CheckRun:
    """The verdicts of one check, in the catalogue's order, and how long it took."""

    verdicts: list[Verdict]
    seconds: float
    image: str | None
    version: str
    tasks_total: int

    def counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for v in self.verdicts:
            out[v.status] = out.get(v.status, 0) + 1
        return dict(sorted(out.items()))

    def reasons(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for v in self.verdicts:
            if v.status != "accepted":
                out[v.reason] = out.get(v.reason, 0) + 1
        return dict(sorted(out.items()))


def malformed_verdicts(catalogue: Catalogue) -> list[Verdict]:
    return [
        Verdict(m.id, m.rel, m.rel.split("/")[0], "refused", "malformed", m.reason)
        for m in catalogue.malformed
    ]


async def run_check(
    client: orchard.AsyncOrchard,
    proxy: ModelProxyClient,
    catalogue: Catalogue,
    tasks: Sequence[BenchTask] | None = None,
    *,
    concurrency: int = 4,
    image: str | None = None,
    on_verdict: Callable[[Verdict], None] | None = None,
) -> CheckRun:
    """Reference and null runs of ``tasks`` (default: every readable task of ``catalogue``,
    and the malformed ones refused as such)."""
    began = time.monotonic()
    chosen = list(catalogue.tasks if tasks is None else tasks)
    options = SandboxOptions(image=image, network="none", ttl=3600.0,
                             labels={"orchard.recipes/claw-bench": "check"})  # fmt: skip
    verdicts = malformed_verdicts(catalogue) if tasks is None else []
    for start in range(0, len(chosen), BATCH):
        batch = [to_claw_task(t, catalogue.version) for t in chosen[start : start + BATCH]]
        checks = await check_tasks(client, batch, proxy=proxy, sandbox=options,
                                   concurrency=concurrency)  # fmt: skip
        for check in checks:
            verdict = judge(check)
            verdicts.append(verdict)
            if on_verdict is not None:
                on_verdict(verdict)
    return CheckRun(verdicts, round(time.monotonic() - began, 1), image, catalogue.version,
                    catalogue.total if tasks is None else len(chosen))  # fmt: skip
