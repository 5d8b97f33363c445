"""The rewards service from Python: ``Rewards`` and ``AsyncRewards`` over the RewardService stubs.

    from orchard import Orchard
    rewards = Orchard().rewards               # endpoint: ORCHARD_REWARDS_ENDPOINT or the local stack's
    report = rewards.grade(instance_row, agent_output)
    report.kind, report.resolved, report.reward   # reward None: infrastructure failure, drop it

Errors are the SDK's usual tree (``InvalidRequestError`` for a malformed
instance, ``AuthenticationError``, ...). A judge that fails is not an error:
``JudgeVerdict.ok`` is False with ``failure`` saying why.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from orchard._proto.orchard.v1 import rewards_pb2

from ._config import ClientConfig
from ._core import translate_errors
from ._errors import ConfigurationError


@dataclass(frozen=True)
class GradeReport:
    """The grading of one patch on one SWE-style instance (:meth:`Rewards.grade`)."""

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
    """The LLM judge's answer (:meth:`Rewards.judge`); ``ok`` False is no verdict (``failure``
    says why), never a silent 0."""

    ok: bool
    data: dict[str, Any]
    failure: str
    cached: bool
    template: str
    model: str


@dataclass(frozen=True)
class ProcessReward:
    """A process reward for one trajectory (:meth:`Rewards.score_process`): the outcome plus
    alpha times the judge's weighted rubric score ``j``, or 0 when the anti-hacking gate
    refused the patch or trajectory (``gated``, ``gate_reasons``); docs/rewards.md."""

    reward: float
    judged: bool
    j: float
    scores: dict[str, float]
    gated: bool
    gate_reasons: list[str]
    reasoning: str
    failure: str


def grade_request(
    instance: Mapping[str, Any] | str,
    output: str,
    scheme: str,
    f2p_weight: float,
    test_timeout: float,
) -> rewards_pb2.GradeRequest:
    return rewards_pb2.GradeRequest(
        instance_json=instance if isinstance(instance, str) else json.dumps(instance),
        output=output, scheme=scheme, f2p_weight=f2p_weight, test_timeout_seconds=test_timeout,
    )  # fmt: skip


def grade_report(r: rewards_pb2.GradeResponse) -> GradeReport:
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


def _finding(f: rewards_pb2.GateFinding) -> dict[str, Any]:
    return {
        "rule": f.rule, "severity": f.severity, "path": f.path, "line": f.line,
        "reason": f.reason, "zeroes_reward": f.zeroes_reward,
    }  # fmt: skip


def judge_request(template: str, inputs: Mapping[str, str]) -> rewards_pb2.JudgeRequest:
    return rewards_pb2.JudgeRequest(template=template, inputs=dict(inputs))


def judge_verdict(r: rewards_pb2.JudgeResponse) -> JudgeVerdict:
    data = json.loads(r.verdict_json) if r.has_verdict else {}
    return JudgeVerdict(r.has_verdict, data, r.failure, r.cached, r.template, r.model)


def score_process_request(
    task: str,
    trajectory: Sequence[Mapping[str, Any]],
    patch: str,
    outcome: float,
    alpha: float,
    gold_patch: str,
    fail_to_pass: Sequence[str],
) -> rewards_pb2.ScoreProcessRequest:
    return rewards_pb2.ScoreProcessRequest(
        task=task, trajectory_json=json.dumps(list(trajectory)), patch=patch, outcome=outcome,
        alpha=alpha, gold_patch=gold_patch, fail_to_pass=list(fail_to_pass),
    )  # fmt: skip


def process_reward(r: rewards_pb2.ScoreProcessResponse) -> ProcessReward:
    return ProcessReward(
        r.reward, r.judged, r.j, dict(r.scores), r.gated, list(r.gate_reasons), r.reasoning,
        r.failure,
    )  # fmt: skip


def rank_request(task: str, candidates: Sequence[Mapping[str, Any]]) -> rewards_pb2.RankRequest:
    return rewards_pb2.RankRequest(
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


def ranking(r: rewards_pb2.RankResponse) -> list[tuple[str, float]]:
    return [(c.id, c.score) for c in r.ranked]


class Rewards:
    """A client of the RewardService (grade, judge, score_process, rank).

    ``client.rewards`` is the usual way in; ``Rewards(endpoint, api_key)`` makes
    one over the default client with that rewards endpoint.
    """

    def __init__(
        self, endpoint: str | None = None, api_key: str | None = None, *, client: Any = None
    ) -> None:
        if client is None:
            from ._sync_client import Orchard

            config = ClientConfig.resolve(_compat_endpoint(endpoint), api_key)
            client = Orchard.from_config(config, rewards_endpoint=endpoint)
        self._client = client

    @property
    def endpoint(self) -> str:
        """host:port of the rewards service."""
        return self._client.config.rewards_endpoint(self._client._rewards_endpoint)  # type: ignore[no-any-return]

    def _call(self, method: str, request: Any, timeout: float | None) -> Any:
        stub = self._client._rewards_stub()
        with translate_errors():
            return getattr(stub, method)(
                request, metadata=self._client.api_metadata, timeout=timeout
            )

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
        request = grade_request(instance, output, scheme, f2p_weight, test_timeout)
        return grade_report(self._call("Grade", request, timeout))

    def judge(
        self, template: str, inputs: Mapping[str, str], timeout: float | None = 600.0
    ) -> JudgeVerdict:
        """Ask the LLM judge with one of its templates; a failed judgement is ``ok=False``."""
        return judge_verdict(self._call("Judge", judge_request(template, inputs), timeout))

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
        """The process reward model: ``outcome + alpha * J`` with the rubric judge's J."""
        request = score_process_request(
            task, trajectory, patch, outcome, alpha, gold_patch, fail_to_pass
        )
        return process_reward(self._call("ScoreProcess", request, timeout))

    def rank(
        self, task: str, candidates: Sequence[Mapping[str, Any]], timeout: float | None = 600.0
    ) -> list[tuple[str, float]]:
        """Candidates (``{"id", "trajectory", "patch"}``) as (id, P(resolved)), best first."""
        return ranking(self._call("Rank", rank_request(task, candidates), timeout))


class AsyncRewards:
    """:class:`Rewards` for asyncio (``async_client.rewards``)."""

    def __init__(
        self, endpoint: str | None = None, api_key: str | None = None, *, client: Any = None
    ) -> None:
        if client is None:
            from ._async_client import AsyncOrchard

            config = ClientConfig.resolve(_compat_endpoint(endpoint), api_key)
            client = AsyncOrchard.from_config(config, rewards_endpoint=endpoint)
        self._client = client

    @property
    def endpoint(self) -> str:
        """host:port of the rewards service."""
        return self._client.config.rewards_endpoint(self._client._rewards_endpoint)  # type: ignore[no-any-return]

    async def _call(self, method: str, request: Any, timeout: float | None) -> Any:  # noqa: ASYNC109
        stub = self._client._rewards_stub()
        with translate_errors():
            return await getattr(stub, method)(
                request, metadata=self._client.api_metadata, timeout=timeout
            )

    async def grade(
        self,
        instance: Mapping[str, Any] | str,
        output: str,
        scheme: str = "pm1",
        f2p_weight: float = 0.0,
        test_timeout: float = 0.0,
        timeout: float | None = 3600.0,  # noqa: ASYNC109 (the call's deadline)
    ) -> GradeReport:
        """See :meth:`Rewards.grade`."""
        request = grade_request(instance, output, scheme, f2p_weight, test_timeout)
        return grade_report(await self._call("Grade", request, timeout))

    async def judge(
        self,
        template: str,
        inputs: Mapping[str, str],
        timeout: float | None = 600.0,  # noqa: ASYNC109
    ) -> JudgeVerdict:
        """See :meth:`Rewards.judge`."""
        return judge_verdict(await self._call("Judge", judge_request(template, inputs), timeout))

    async def score_process(
        self,
        task: str,
        trajectory: Sequence[Mapping[str, Any]],
        patch: str,
        outcome: float,
        alpha: float = 0.0,
        gold_patch: str = "",
        fail_to_pass: Sequence[str] = (),
        timeout: float | None = 600.0,  # noqa: ASYNC109
    ) -> ProcessReward:
        """See :meth:`Rewards.score_process`."""
        request = score_process_request(
            task, trajectory, patch, outcome, alpha, gold_patch, fail_to_pass
        )
        return process_reward(await self._call("ScoreProcess", request, timeout))

    async def rank(
        self,
        task: str,
        candidates: Sequence[Mapping[str, Any]],
        timeout: float | None = 600.0,  # noqa: ASYNC109
    ) -> list[tuple[str, float]]:
        """See :meth:`Rewards.rank`."""
        return ranking(await self._call("Rank", rank_request(task, candidates), timeout))


def _compat_endpoint(rewards_endpoint: str | None) -> str | None:
    """The gateway endpoint for ``Rewards(endpoint, ...)`` made without a client: the
    usual one when it can be found, else the rewards endpoint itself (only its key is used)."""
    try:
        return ClientConfig.resolve().endpoint
    except ConfigurationError:
        return rewards_endpoint
