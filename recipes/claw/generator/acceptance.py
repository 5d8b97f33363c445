"""The acceptance rule, and the feedback a revision is given when a task fails it.

A task is **kept** only if, in real sandboxes, its oracle run *passes* (score at or above
the pass threshold) and its null run *fails* (below it). Everything else is a verdict with a
reason code and, where the model can fix it, feedback for the revise stage:

==================  ==========================================================  ==========
reason              when                                                        revisable
==================  ==========================================================  ==========
``oracle_failed``   the oracle run scored below the threshold (the grader is    yes
                    too strict, or the oracle does not do the task)
``null_passed``     the null run scored at or above it (the grader is too       yes
                    lax: the fixtures already satisfy it)
``task_fault``      a run was not graded because of the task (its fixtures or   yes
                    setup failed, its grader raised)
``infrastructure``  a run was not graded because a sandbox or the proxy failed  no
==================  ==========================================================  ==========

Both failures at once are one verdict, ``oracle_failed`` (the feedback names both).
"""

from __future__ import annotations

from dataclasses import dataclass

from .backend import Trial


@dataclass(frozen=True)
class Verdict:
    kept: bool
    reason: str
    feedback: str = ""
    revisable: bool = False


MAX_CHECK_LINES = 20
MAX_FEEDBACK = 8000
"""Feedback is cut to this many characters (it quotes faults and checks' findings)."""


def _components(trial: Trial) -> str:
    parts = [f"{name}={score:g}" for name, score in sorted(trial.components.items())]
    safety = f"; safety checks fired: {', '.join(trial.safety)}" if trial.safety else ""
    checks = "".join(f"\n  - {line}" for line in trial.checks[:MAX_CHECK_LINES])
    return (", ".join(parts) or "no components reported") + safety + checks


def judge(oracle: Trial, null: Trial, threshold: float) -> Verdict:
    """The verdict on a task from its oracle and null trials."""
    for trial in (oracle, null):
        if trial.fault is not None:
            if not trial.fault_is_task:
                return Verdict(False, "infrastructure", f"{trial.kind} run: {trial.fault}")
            return Verdict(
                False, "task_fault",
                f"The {trial.kind} run could not be graded because of the task: "
                f"{trial.fault[:MAX_FEEDBACK]}",
                revisable=True,
            )  # fmt: skip
        if trial.score is None:
            return Verdict(False, "infrastructure", f"{trial.kind} run: no score and no fault")
    problems = []
    if not oracle.passed:
        problems.append(
            f"The oracle solution scored {oracle.score:g}, below the pass mark {threshold:g} "
            f"(components: {_components(oracle)}): either the oracle does not do the task or "
            "the grader asks for more than the task's prompt requests."
        )
    if null.passed:
        problems.append(
            f"A null run (the agent does nothing) scored {null.score:g}, at or above the pass "
            f"mark {threshold:g} (components: {_components(null)}): the grader is too lax; it "
            "must check something only doing the task achieves, not what the fixtures "
            "already hold."
        )
    if not problems:
        return Verdict(True, "kept")
    reason = "oracle_failed" if not oracle.passed else "null_passed"
    return Verdict(False, reason, "\n".join(problems)[:MAX_FEEDBACK], revisable=True)
