"""What a grading run produced: the failure kind, the per-test report and the reward."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

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
    contradicts the log): counted as not resolved, as swebench does."""
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

    @property
    def is_infrastructure(self) -> bool:
        return self.kind is GradeKind.INFRASTRUCTURE

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
            "duration_seconds": round(self.duration_seconds, 3),
        }
