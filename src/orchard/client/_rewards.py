"""The rewards service from Python: ``Rewards`` (sync) over the RewardService stubs.

    from orchard import Rewards
    rewards = Rewards()                       # endpoint: ORCHARD_REWARDS_ENDPOINT or the local stack's
    report = rewards.grade(instance_row, agent_output)
    report.kind, report.resolved, report.reward   # reward None: infrastructure failure, drop it

Errors are the SDK's usual tree (``InvalidRequestError`` for a malformed
instance, ``AuthenticationError``, ...). A judge that fails is not an error:
``JudgeVerdict.ok`` is False with ``failure`` saying why.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from orchard._proto.orchard.v1 import rewards_pb2, rewards_pb2_grpc

from ._channels import sync_channel
from ._config import DEFAULT_HOME, ClientConfig
from ._core import api_metadata, translate_errors
from ._errors import ConfigurationError


@dataclass(frozen=True)
class GradeReport:
    instance_id: str
    kind: str
    """graded, no_patch, patch_does_not_apply, timeout, invalid_log or infrastructure."""
    resolved: bool
    resolution: str
    reward: float | None
    """None when the platform failed (``kind == "infrastructure"``): drop the sample."""
    fail_to_pass: tuple[list[str], list[str]]
    """(success, failure)."""
    pass_to_pass: tuple[list[str], list[str]]
    apply_method: str
    reason: str
    log_tail: str
    duration_seconds: float
    test_statuses: dict[str, str] = field(default_factory=dict)
    integrity: list[str] = field(default_factory=list)
    """Why no reward was earned on the evidence: forged_log, runner_incomplete,
    test_infrastructure_modified, gated (a finding the dataset's reward_policy zeroes)."""
    findings: list[dict[str, Any]] = field(default_factory=list)
    """The anti-hacking findings: rule, severity, path, line, reason, zeroes_reward."""
    restored_files: list[str] = field(default_factory=list)
    fault: str = "task"
    """"task" for every candidate failure (hacks included); "infrastructure" only when the platform failed."""

    @property
    def is_infrastructure(self) -> bool:
        return self.kind == "infrastructure"


@dataclass(frozen=True)
class JudgeVerdict:
    ok: bool
    data: dict[str, Any]
    failure: str
    cached: bool
    template: str
    model: str


@dataclass(frozen=True)
class ProcessReward:
    reward: float
    judged: bool
    j: float
    scores: dict[str, float]
    gated: bool
    gate_reasons: list[str]
    reasoning: str
    failure: str


def _finding(f: rewards_pb2.GateFinding) -> dict[str, Any]:
    return {
        "rule": f.rule, "severity": f.severity, "path": f.path, "line": f.line,
        "reason": f.reason, "zeroes_reward": f.zeroes_reward,
    }  # fmt: skip


def _rewards_endpoint(explicit: str | None) -> str:
    if explicit:
        return explicit
    if os.environ.get("ORCHARD_REWARDS_ENDPOINT"):
        return os.environ["ORCHARD_REWARDS_ENDPOINT"]
    path = Path(os.environ.get("ORCHARD_HOME") or DEFAULT_HOME) / "run" / "rewards.addr"
    try:
        return path.read_text().strip()
    except OSError:
        raise ConfigurationError(
            f"no rewards endpoint: pass endpoint=..., set ORCHARD_REWARDS_ENDPOINT, or run `orchard up` (it writes {path})"
        ) from None


class Rewards:
    """A client of the RewardService (grade, judge, score_process, rank)."""

    def __init__(self, endpoint: str | None = None, api_key: str | None = None) -> None:
        self.endpoint = _rewards_endpoint(endpoint)
        self._config = ClientConfig.resolve(self.endpoint, api_key)  # only its key is used here
        self._stub = rewards_pb2_grpc.RewardServiceStub(sync_channel(self.endpoint))

    def grade(
        self,
        instance: Mapping[str, Any] | str,
        output: str,
        scheme: str = "pm1",
        f2p_weight: float = 0.0,
        test_timeout: float = 0.0,
        timeout: float | None = 3600.0,
    ) -> GradeReport:
        """Run ``instance``'s tests on the patch in ``output`` (a diff or a whole agent answer)."""
        request = rewards_pb2.GradeRequest(
            instance_json=instance if isinstance(instance, str) else json.dumps(instance),
            output=output, scheme=scheme, f2p_weight=f2p_weight, test_timeout_seconds=test_timeout,
        )  # fmt: skip
        with translate_errors():
            r = self._stub.Grade(request, metadata=api_metadata(self._config), timeout=timeout)
        return GradeReport(
            instance_id=r.instance_id, kind=r.kind, resolved=r.resolved, resolution=r.resolution,
            reward=r.reward if r.has_reward else None,
            fail_to_pass=(list(r.fail_to_pass.success), list(r.fail_to_pass.failure)),
            pass_to_pass=(list(r.pass_to_pass.success), list(r.pass_to_pass.failure)),
            apply_method=r.apply_method, reason=r.reason, log_tail=r.log_tail,
            duration_seconds=r.duration_seconds, test_statuses=dict(r.test_statuses),
            integrity=list(r.integrity), findings=[_finding(f) for f in r.findings],
            restored_files=list(r.restored_files), fault=r.fault or "task",
        )  # fmt: skip

    def judge(
        self, template: str, inputs: Mapping[str, str], timeout: float | None = 600.0
    ) -> JudgeVerdict:
        with translate_errors():
            r = self._stub.Judge(
                rewards_pb2.JudgeRequest(template=template, inputs=dict(inputs)),
                metadata=api_metadata(self._config), timeout=timeout,
            )  # fmt: skip
        data = json.loads(r.verdict_json) if r.has_verdict else {}
        return JudgeVerdict(r.has_verdict, data, r.failure, r.cached, r.template, r.model)

    def score_process(
        self,
        task: str,
        trajectory: Sequence[Mapping[str, Any]],
        patch: str,
        outcome: float,
        alpha: float = 0.0,
        gold_patch: str = "",
        fail_to_pass: Sequence[str] = (),
        timeout: float | None = 600.0,
    ) -> ProcessReward:
        request = rewards_pb2.ScoreProcessRequest(
            task=task, trajectory_json=json.dumps(list(trajectory)), patch=patch, outcome=outcome,
            alpha=alpha, gold_patch=gold_patch, fail_to_pass=list(fail_to_pass),
        )  # fmt: skip
        with translate_errors():
            r = self._stub.ScoreProcess(
                request, metadata=api_metadata(self._config), timeout=timeout
            )
        return ProcessReward(
            r.reward,
            r.judged,
            r.j,
            dict(r.scores),
            r.gated,
            list(r.gate_reasons),
            r.reasoning,
            r.failure,
        )

    def rank(
        self, task: str, candidates: Sequence[Mapping[str, Any]], timeout: float | None = 600.0
    ) -> list[tuple[str, float]]:
        """Candidates (``{"id", "trajectory", "patch"}``) as (id, P(resolved)), best first."""
        request = rewards_pb2.RankRequest(
            task=task,
            candidates=[
                rewards_pb2.RankCandidate(
                    id=str(c.get("id", i)),
                    trajectory_json=json.dumps(list(c.get("trajectory", []))),
                    patch=str(c.get("patch", "")),
                )
                for i, c in enumerate(candidates)
            ],
        )
        with translate_errors():
            r = self._stub.Rank(request, metadata=api_metadata(self._config), timeout=timeout)
        return [(c.id, c.score) for c in r.ranked]
