"""The gRPC RewardService: request checks, then the plain scorer functions.

Bad input is INVALID_ARGUMENT with the field named; a reranker that was not
configured is FAILED_PRECONDITION; everything a sandbox or a judge did wrong
is in the answer (``kind``, ``failure``), not an RPC error. Refusals are raised
as :class:`~orchard.common.errors.ServiceError` and leave through the one
service edge, so they carry the ``orchard-reason`` / ``orchard-fault`` trailers
like every other service's.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import grpc

from orchard._proto.orchard.v1 import rewards_pb2, rewards_pb2_grpc
from orchard.common.errors import invalid, precondition

from .auth import KeyCheck
from .judge.client import Judge
from .judge.templates import get_template
from .prm.scorer import DEFAULT_ALPHA, Reference, score_process
from .rerank.model import ValueModel
from .rerank.store import Rollout
from .settings import RewardSettings
from .swe.diff_gate import HIGH, Finding
from .swe.instance import InstanceError, parse_instance
from .swe.outcome import GradeResult
from .swe.policy import RewardPolicy
from .swe.runner import RunnerSettings, grade_patch_async
from .swe.schemes import DEFAULT_F2P_WEIGHT, RewardScheme

MAX_TEXT = 16 * 1024 * 1024
MAX_CANDIDATES = 256
LOG_TAIL = 64 * 1024

Context = grpc.aio.ServicerContext[Any, Any]


def _trajectory(text: str, field: str) -> list[dict[str, Any]]:
    if not text:
        return []
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise invalid(f"{field}: not valid JSON ({exc.msg})") from None
    if not isinstance(value, list) or not all(isinstance(m, dict) for m in value):
        raise invalid(f"{field}: must be a JSON list of message objects")
    return value


def finding_message(finding: Finding, zeroes: bool) -> rewards_pb2.GateFinding:
    return rewards_pb2.GateFinding(
        rule=finding.rule, severity=finding.severity, path=finding.path, line=finding.line,
        reason=finding.reason[:1000], zeroes_reward=zeroes,
    )  # fmt: skip


def grade_response(
    result: GradeResult, policy: RewardPolicy | None = None
) -> rewards_pb2.GradeResponse:
    policy = policy or RewardPolicy()
    return rewards_pb2.GradeResponse(
        instance_id=result.instance_id,
        kind=result.kind.value,
        resolved=result.resolved,
        resolution=result.resolution.value,
        has_reward=result.reward is not None,
        reward=result.reward or 0.0,
        fail_to_pass=rewards_pb2.TestOutcomes(
            success=result.fail_to_pass.success, failure=result.fail_to_pass.failure
        ),
        pass_to_pass=rewards_pb2.TestOutcomes(
            success=result.pass_to_pass.success, failure=result.pass_to_pass.failure
        ),
        apply_method=result.apply_method,
        reason=result.reason[-8000:],
        log_tail=result.log[-LOG_TAIL:],
        duration_seconds=result.duration_seconds,
        test_statuses=result.statuses,
        integrity=result.integrity,
        findings=[finding_message(f, policy.zeroes(f)) for f in result.findings[:200]],
        restored_files=result.restored_files[:200],
        fault=result.fault,
    )


class RewardService(rewards_pb2_grpc.RewardServiceServicer):
    def __init__(self, settings: RewardSettings, keys: KeyCheck, judge: Judge) -> None:
        self.settings = settings
        self.keys = keys
        self.judge = judge
        self.value_model = ValueModel.load(settings.value_model) if settings.value_model else None
        self._grades = asyncio.Semaphore(settings.max_concurrent_grades)

    async def Grade(
        self, request: rewards_pb2.GradeRequest, context: Context
    ) -> rewards_pb2.GradeResponse:
        key = await self.keys.require(context)
        if len(request.output) > MAX_TEXT or len(request.instance_json) > MAX_TEXT:
            raise invalid(f"output and instance_json are limited to {MAX_TEXT} bytes")
        try:
            instance = parse_instance(request.instance_json)
        except InstanceError as exc:
            raise invalid(f"instance_json: {exc}") from None
        try:
            scheme = RewardScheme(request.scheme or RewardScheme.PM1)
        except ValueError:
            raise invalid(f"scheme: must be one of {[s.value for s in RewardScheme]}") from None
        if not 0 <= request.f2p_weight <= 1 or request.test_timeout_seconds < 0:
            raise invalid("f2p_weight must be in [0, 1] and test_timeout_seconds >= 0")
        settings = RunnerSettings(
            endpoint=self.settings.gateway,
            api_key=key,
            scheme=scheme,
            f2p_weight=request.f2p_weight or DEFAULT_F2P_WEIGHT,
            test_timeout_seconds=request.test_timeout_seconds or self.settings.test_timeout_seconds,
        )
        async with self._grades:
            result = await grade_patch_async(instance, request.output, settings)
        return grade_response(result, instance.reward_policy)

    async def Judge(
        self, request: rewards_pb2.JudgeRequest, context: Context
    ) -> rewards_pb2.JudgeResponse:
        await self.keys.require(context)
        try:
            template = get_template(request.template)
        except KeyError as exc:
            raise invalid(f"template: {exc.args[0]}") from None
        if sum(len(v) for v in request.inputs.values()) > MAX_TEXT:
            raise invalid(f"inputs are limited to {MAX_TEXT} bytes")
        verdict = await self.judge.judge(template, dict(request.inputs))
        return rewards_pb2.JudgeResponse(
            has_verdict=verdict.ok,
            verdict_json=json.dumps(verdict.data) if verdict.ok else "",
            failure=verdict.failure,
            cached=verdict.cached,
            template=template.key,
            model=self.judge.settings.model,
        )

    async def ScoreProcess(
        self, request: rewards_pb2.ScoreProcessRequest, context: Context
    ) -> rewards_pb2.ScoreProcessResponse:
        await self.keys.require(context)
        messages = _trajectory(request.trajectory_json, "trajectory_json")
        if request.alpha < 0:
            raise invalid("alpha must be >= 0")
        reference = Reference(request.gold_patch, tuple(request.fail_to_pass))
        score = await score_process(
            self.judge, request.task, messages, request.patch, request.outcome,
            reference, request.alpha or DEFAULT_ALPHA,
        )  # fmt: skip
        return rewards_pb2.ScoreProcessResponse(
            reward=score.reward, judged=score.judged, j=score.j, scores=score.scores,
            gated=score.gated, gate_reasons=score.gate_reasons, reasoning=score.reasoning,
            failure=score.failure,
            findings=[finding_message(f, f.severity == HIGH) for f in score.findings[:200]],
        )  # fmt: skip

    async def Rank(
        self, request: rewards_pb2.RankRequest, context: Context
    ) -> rewards_pb2.RankResponse:
        await self.keys.require(context)
        if self.value_model is None:
            raise precondition(
                "no value model loaded: start the service with --value-model MODEL.npz",
                "ERROR_REASON_UNSPECIFIED",
            )
        if not request.candidates or len(request.candidates) > MAX_CANDIDATES:
            raise invalid(f"candidates: give 1 to {MAX_CANDIDATES}")
        rollouts = []
        for i, c in enumerate(request.candidates):
            trajectory = _trajectory(c.trajectory_json, f"candidates[{i}].trajectory_json")
            rollouts.append(
                Rollout(
                    request.task,
                    request.task,
                    trajectory,
                    c.patch,
                    False,
                    rollout_id=c.id or str(i),
                )
            )
        model = self.value_model
        ranked = await asyncio.to_thread(model.rank, rollouts)
        out = [rewards_pb2.RankedCandidate(id=rollouts[i].rollout_id, score=s) for i, s in ranked]
        return rewards_pb2.RankResponse(ranked=out, best_id=out[0].id)
