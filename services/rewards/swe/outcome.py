"""What a grading run produced: the failure kind, the per-test report and the reward."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from .diff_gate import Finding
from .grading import Outcomes, Resolution
from .status import StatusMap


class GradeKind(StrEnum):
    """How a run ended. Only ``INFRASTRUCTURE`` is not the candidate's fault."""

    GRADED = "graded"
    """The tests ran and the log was graded (resolved or not)."""
    NO_PATCH = "no_patch"
    """The output held no diff."""
    PATCH_DOES_NOT_APPLY = "patch_does_not_apply"
    """Every step of the apply cascade failed."""
    TIMEOUT = "timeout"
    """The test run hit its time limit."""
    INVALID_LOG = "invalid_log"
    """The log cannot be graded (no markers, no evidence the tests ran, exit code
    contradicts the log, and, on a witnessed run, ``forged_log`` or
    ``runner_incomplete`` in ``integrity``): counted as not resolved."""
    INFRASTRUCTURE = "infrastructure"
    """The platform or the instance failed (sandbox, image, test patch): drop the sample."""


@dataclass
class GradeResult:
    instance_id: str
    kind: GradeKind
    resolved: bool = False
    resolution: Resolution = Resolution.NO
    reward: float | None = None
    """None for INFRASTRUCTURE: there is nothing to learn from the sample."""
    fail_to_pass: Outcomes = field(default_factory=Outcomes)
    pass_to_pass: Outcomes = field(default_factory=Outcomes)
    statuses: StatusMap = field(default_factory=dict)
    apply_method: str = ""
    reason: str = ""
    log: str = ""
    duration_seconds: float = 0.0
    integrity: list[str] = field(default_factory=list)
    """Why the run earned no reward on its evidence: ``forged_log``, ``runner_incomplete``,
    ``test_infrastructure_modified``, ``gated`` (a finding the policy zeroes)."""
    findings: list[Finding] = field(default_factory=list)
    """The static gate's findings and the restored test files, each with a severity."""
    restored_files: list[str] = field(default_factory=list)
    """Test infrastructure the candidate touched, put back to the instance's before the run."""

    @property
    def is_infrastructure(self) -> bool:
        return self.kind is GradeKind.INFRASTRUCTURE

    @property
    def fault(self) -> str:
        """``infrastructure`` (drop the sample) only for platform failures; every hack is ``task``."""
        return "infrastructure" if self.is_infrastructure else "task"

    def to_dict(self) -> dict[str, Any]:
        return {
            "instance_id": self.instance_id,
            "kind": self.kind.value,
            "resolved": self.resolved,
            "resolution": self.resolution.value,
            "reward": self.reward,
            "fail_to_pass": {
                "success": self.fail_to_pass.success,
                "failure": self.fail_to_pass.failure,
            },
            "pass_to_pass": {
                "success": self.pass_to_pass.success,
                "failure": self.pass_to_pass.failure,
            },
            "f2p_rate": self.fail_to_pass.rate,
            "p2p_rate": self.pass_to_pass.rate,
            "apply_method": self.apply_method,
            "reason": self.reason,
            "fault": self.fault,
            "integrity": self.integrity,
            "findings": [f.to_dict() for f in self.findings],
            "restored_files": self.restored_files,
            "duration_seconds": round(self.duration_seconds, 3),
        }
