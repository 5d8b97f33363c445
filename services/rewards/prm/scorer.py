"""Scoring a trajectory: gate, then the seven-rubric judge, then ``reward = outcome + alpha * J``.

- Gate failure: reward 0, whatever the outcome, with the reasons.
- Judge failure: no judgement (``judged`` False); the reward falls back to the
  outcome alone (J = 0), as the original did, and the failure is reported so a
  trainer may drop the sample instead.
- The reference block (gold patch, FAIL_TO_PASS ids) is shown only for the
  rubrics that need it (R2, R3, R5), and the prompt says so.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from ..judge.client import Judge
from ..judge.templates import RubricTemplate, register
from ..swe.diff_gate import Finding
from .gate import gate
from .render import Message, head_tail, render_trajectory
from .rubrics import RUBRICS, snap, weighted_mean

DEFAULT_ALPHA = 0.5

_SCHEMA = {
    "type": "object",
    "required": ["reasoning", "scores"],
    "properties": {
        "reasoning": {"type": "string"},
        "scores": {
            "type": "object",
            "required": [r.key for r in RUBRICS],
            "properties": {r.key: {"type": "number", "minimum": 0, "maximum": 1} for r in RUBRICS},
        },
    },
}

PRM_TEMPLATE = RubricTemplate(
    name="prm_rubrics",
    version="2",
    system=(
        "You grade how an AI software agent worked on a task, not only its result. "
        "Score each rubric from 0.0 to 1.0 in steps of 0.1. Reply with one JSON object only: "
        '{"reasoning": "...", "scores": {"R1": x, ..., "R7": x}}.'
    ),
    user=(
        "Rubrics:\n{rubrics}\n\nTask:\n{task}\n\n{reference}Trajectory (compacted):\n{trajectory}\n\n"
        "Final patch:\n```diff\n{patch}\n```\n\n{findings}"
    ),
    schema=_SCHEMA,
)
register(PRM_TEMPLATE)


@dataclass(frozen=True)
class Reference:
    gold_patch: str = ""
    fail_to_pass: tuple[str, ...] = ()

    def render(self) -> str:
        if not self.gold_patch and not self.fail_to_pass:
            return ""
        uses = ", ".join(r.key for r in RUBRICS if r.uses_reference)
        parts = [f"Reference (use ONLY for {uses}; do not grade R1/R4/R6/R7 against it):"]
        if self.fail_to_pass:
            parts.append(
                "Tests that must pass after a correct fix: " + ", ".join(self.fail_to_pass[:50])
            )
        if self.gold_patch:
            parts.append(
                f"A known-good patch:\n```diff\n{head_tail(self.gold_patch, 3000, 1000)}\n```"
            )
        return "\n".join(parts) + "\n\n"


@dataclass
class ProcessScore:
    reward: float
    judged: bool
    j: float = 0.0
    scores: dict[str, float] = field(default_factory=dict)
    gated: bool = False
    gate_reasons: list[str] = field(default_factory=list)
    reasoning: str = ""
    failure: str = ""
    findings: list[Finding] = field(default_factory=list)
    """The static gate's findings on the patch (gating or shown to the judge)."""


def rubric_text() -> str:
    return "\n".join(f"{r.key} {r.name} (weight {r.weight}): {r.question}" for r in RUBRICS)


def render_findings(findings: Sequence[Finding]) -> str:
    """The static findings as the judge reads them (weigh them in R7, verification integrity)."""
    if not findings:
        return ""
    lines = [f"- {f.render()}" for f in findings[:30]]
    return (
        "Static checks of the patch found (weigh these in R7; they are hints, not proof):\n"
        + "\n".join(lines)
    )


def prm_inputs(
    task: str,
    messages: Sequence[Message],
    patch: str,
    reference: Reference | None,
    findings: Sequence[Finding] = (),
) -> dict[str, str]:
    return {
        "findings": render_findings(findings),
        "rubrics": rubric_text(),
        "task": head_tail(task, 4000, 1000),
        "reference": reference.render() if reference else "",
        "trajectory": render_trajectory(messages),
        "patch": head_tail(patch, 6000, 2000),
    }


async def score_process(
    judge: Judge,
    task: str,
    messages: Sequence[Message],
    patch: str,
    outcome: float,
    reference: Reference | None = None,
    alpha: float = DEFAULT_ALPHA,
) -> ProcessScore:
    checked = gate(patch, messages)
    if not checked.passed:
        return ProcessScore(
            reward=0.0, judged=False, gated=True, gate_reasons=checked.reasons,
            findings=checked.findings,
        )  # fmt: skip
    inputs = prm_inputs(task, messages, patch, reference, checked.findings)
    verdict = await judge.judge(PRM_TEMPLATE, inputs)
    if not verdict.ok:
        return ProcessScore(
            reward=outcome, judged=False, failure=verdict.failure, findings=checked.findings
        )
    scores = {r.key: snap(float(verdict.data["scores"][r.key])) for r in RUBRICS}
    j = weighted_mean(scores)
    return ProcessScore(
        reward=outcome + alpha * j,
        judged=True,
        j=j,
        scores=scores,
        reasoning=str(verdict.data.get("reasoning", "")),
        findings=checked.findings,
    )
