"""Sort claw-bench's tasks into accepted and refused, each refusal with a precise reason.

A task is **accepted** when, run through the Claw runner (``runner.check_tasks``: real sandboxes
of the default image, network ``none``), its setup runs, its reference solution passes its
verifier (every check: claw-bench's own ``passed``, so score 1.0) and a null run (no action at
all) fails it, by claw-bench's measure and by the Claw runner's (score below the pass mark,
``tasks.PASS_THRESHOLD``). Every other task is **refused**, with
a reason read from the evidence (the setup's, the solution's or the verifier's own output):

- ``malformed``: the task folder is not a task (:class:`.source.Malformed`);
- ``needs-package``: a Python module the image lacks (``ModuleNotFoundError``);
- ``needs-command``: a program the image lacks (``<name>: command not found``);
- ``needs-network``: name resolution or a connection failed (the sandbox has no network);
- ``setup-fails``: ``setup.sh`` exits non-zero for another reason;
- ``reference-fails``: the reference solution does not pass its own verifier;
- ``null-passes``: the verifier passes (or scores at least the threshold on) the untouched
  workspace, so it cannot tell a solved task from an unsolved one;
- ``verifier-broken``: the verifier runs no check, or crashes before its report.

A run the platform failed (a sandbox that did not start, the proxy) is not a refusal: it is an ``error`` entry, and :func:`.check.run_check` reports it as a
failure of the check, not of the task.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from ..grading import Score
from ..runner import ClawTrial, TaskCheck
from ..tasks import PASS_THRESHOLD

_MODULE = re.compile(r"ModuleNotFoundError: No module named '([^']+)'")
_COMMAND = re.compile(r"(?:^|[\s:])([\w.+-]+): (?:command not found|not found)\b", re.M)
_NETWORK = re.compile(
    r"Could not resolve host|Temporary failure in name resolution|Name or service not known"
    r"|Network is unreachable|Connection refused|getaddrinfo failed|nodename nor servname",
)


@dataclass(frozen=True)
class Verdict:
    """One task's triage: ``status`` ``accepted`` / ``refused`` / ``error``, ``reason`` a
    category (above), ``detail`` the evidence in a sentence."""

    id: str
    rel: str
    category: str
    status: str
    reason: str
    detail: str
    reference: dict[str, Any] | None = None
    null: dict[str, Any] | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "id": self.id, "rel": self.rel, "category": self.category,
            "status": self.status, "reason": self.reason, "detail": self.detail,
        }  # fmt: skip
        if self.reference is not None:
            out["reference"] = self.reference
        if self.null is not None:
            out["null"] = self.null
        return out


def missing_piece(text: str) -> tuple[str, str] | None:
    """``(reason, what is missing)`` when ``text`` (a command's output) shows a module, a
    program or the network missing; None otherwise."""
    if m := _MODULE.search(text):
        top = m.group(1).split(".")[0]
        return "needs-package", f"the Python module {top!r}, which the default image lacks"
    if m := _COMMAND.search(text):
        return "needs-command", f"the command {m.group(1)!r}, which the default image lacks"
    if m := _NETWORK.search(text):
        return "needs-network", f"the network, which sandboxes do not have ({m.group(0)!r})"
    return None


def _short(text: str, limit: int = 300) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else "..." + text[-limit:]


def _check_name(component: str) -> str:
    """``Class::test`` or ``test_output::test`` of a JUnit ``classname::name`` (a note in
    brackets after it kept whole)."""
    name, bracket, note = component.partition(" [")
    return name.rsplit(".", 1)[-1] + bracket + note


def failing_checks(score: Score) -> list[str]:
    return [_check_name(c.name) for c in score.components if c.score < 1.0]


def solution_output(trial: ClawTrial) -> tuple[int | None, str]:
    """The reference solution's exit code and output (the oracle's transcript)."""
    for step in trial.result.transcript or ():
        if isinstance(step, dict) and "script" in step:
            code = step.get("exit")
            return (code if isinstance(code, int) else None), str(step.get("output", ""))
    return None, ""


def verifier_output(trial: ClawTrial) -> str:
    """What the verifier printed (the runner keeps it: ``ClawTrial.verifier``)."""
    return trial.verifier.output if trial.verifier is not None else ""


def summary(trial: ClawTrial) -> dict[str, Any]:
    """A trial's record in the check's JSON (no transcript, outputs cut)."""
    r = trial.result
    out: dict[str, Any] = {"status": str(r.status), "fault": r.fault,
                           "seconds": round(r.seconds, 2)}  # fmt: skip
    if trial.score is not None:
        out["score"] = trial.score.total
        out["checks"] = len(trial.score.components)
        out["failing"] = failing_checks(trial.score)
    code, _ = solution_output(trial)
    if code is not None:
        out["solution_exit"] = code
    return out


def judge(check: TaskCheck) -> Verdict:
    """The verdict on one task from its reference (oracle) and null trials."""
    task, ref, nul = check.task, check.oracle, check.null
    rel = str((task.metadata.get("claw_bench") or {}).get("folder", ""))
    records = {"reference": summary(ref), "null": summary(nul)}

    def verdict(status: str, reason: str, detail: str) -> Verdict:
        return Verdict(task.id, rel, task.category, status, reason, detail, **records)

    for trial in (ref, nul):
        if trial.aborted and trial.result.fault_phase != "setup":
            return verdict("error", "infrastructure", f"the platform failed: {trial.result.fault}")
    if ref.aborted:  # setup's fault: the task's own
        fault = ref.result.fault or ""
        found = missing_piece(fault)
        if found:
            return verdict("refused", found[0], f"setup.sh needs {found[1]}")
        return verdict("refused", "setup-fails", f"setup.sh fails: {_short(fault)}")
    assert ref.score is not None and nul.score is not None
    if ref.score.total < 1.0:
        code, solution_out = solution_output(ref)
        checked = verifier_output(ref) + "\n".join(c.name for c in ref.score.components)
        for text, who in ((solution_out, "the reference solution"), (checked, "the verifier")):
            found = missing_piece(text)
            if found:
                return verdict("refused", found[0], f"{who} needs {found[1]}")
        failing = failing_checks(ref.score)
        if not ref.score.components or failing == ["verifier"]:
            return verdict("refused", "verifier-broken",
                           f"the verifier ran no check: {_short(checked or solution_out)}")  # fmt: skip
        exit_note = f" (solve.sh exited {code})" if code else ""
        return verdict(
            "refused", "reference-fails",
            f"the reference solution{exit_note} fails {len(failing)} of "
            f"{len(ref.score.components)} checks ({', '.join(failing[:3])}"
            f"{', ...' if len(failing) > 3 else ''}): {_short(solution_out or checked, 240)}",
        )  # fmt: skip
    if nul.score.total >= 1.0:
        return verdict("refused", "null-passes",
                       "the verifier passes the untouched workspace (every check)")  # fmt: skip
    if nul.passed:
        return verdict(
            "refused", "null-passes",
            f"the untouched workspace scores {nul.score.total:.3f} (>= {PASS_THRESHOLD}): "
            "it passes under the Claw runner's threshold",
        )  # fmt: skip
    return verdict(
        "accepted",
        "",
        f"reference passes {len(ref.score.components)}/{len(ref.score.components)} checks; "
        f"null run scores {nul.score.total:.3f}",
    )
