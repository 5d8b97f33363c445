"""Running an instance's tests on a candidate patch in a fresh sandbox, through the SDK.

Steps (see ``eval_script`` and ``grading`` for the details):

1. take the patch out of the candidate output (none: ``NO_PATCH``, no sandbox);
2. create a fresh sandbox from the instance's image;
3. upload the patch as a file and apply it with the cascade ``git apply`` ->
   ``git apply --reject`` -> ``patch --fuzz=5`` (all fail: ``PATCH_DOES_NOT_APPLY``);
4. upload and apply the instance's test patch (fails: ``INFRASTRUCTURE``: the
   instance is broken, not the candidate);
5. run the eval script, stderr merged, markers around the tests, with a time
   limit (hit: ``TIMEOUT``);
6. grade the log as swebench does (not gradable: ``INVALID_LOG``);
7. delete the sandbox, whatever happened.

Any platform error (sandbox create, exec/file RPCs, image missing) is
``INFRASTRUCTURE`` with the error in ``reason``; trainers drop those samples.
"""

from __future__ import annotations

import asyncio
import contextlib
import shlex
import time
from dataclasses import dataclass

from orchard.client import AsyncSandbox, ExecResult, OrchardError

from .eval_script import APPLY_COMMANDS, eval_script
from .grading import grade_statuses, read_log
from .instance import SweInstance
from .outcome import GradeKind, GradeResult
from .patch_extract import extract_patch
from .schemes import DEFAULT_F2P_WEIGHT, RewardScheme, reward_for

STAGING_DIR = "/tmp/orchard-reward"
MAX_LOG_BYTES = 8 * 1024 * 1024


@dataclass(frozen=True)
class RunnerSettings:
    endpoint: str | None = None
    """Gateway address (None: the SDK's usual resolution: env, then the local stack's files)."""
    api_key: str | None = None
    cpu: float = 1.0
    memory: str = "2Gi"
    sandbox_ttl_seconds: int = 3600
    """Server-side backstop: the sandbox goes away even if this process dies."""
    apply_timeout_seconds: float = 60.0
    test_timeout_seconds: float = 1800.0
    scheme: RewardScheme = RewardScheme.PM1
    f2p_weight: float = DEFAULT_F2P_WEIGHT


def _finish(result: GradeResult, settings: RunnerSettings, started: float) -> GradeResult:
    graded = result.kind in (GradeKind.GRADED,)
    if result.kind is not GradeKind.INFRASTRUCTURE:
        result.reward = reward_for(
            settings.scheme,
            graded=graded,
            resolved=result.resolved,
            f2p_rate=result.fail_to_pass.rate if graded else 0.0,
            p2p_rate=result.pass_to_pass.rate if graded else 0.0,
            f2p_weight=settings.f2p_weight,
        )
    result.duration_seconds = time.monotonic() - started
    return result


def grade_log(
    instance: SweInstance, log: str, settings: RunnerSettings | None = None
) -> GradeResult:
    """Grade an eval log already produced (no sandbox): swebench's verdict plus our reward."""
    settings = settings or RunnerSettings()
    started = time.monotonic()
    verdict = read_log(log, instance.log_parser)
    if not verdict.gradable:
        kind = GradeKind.TIMEOUT if verdict.reason == "tests_timed_out" else GradeKind.INVALID_LOG
        return _finish(
            GradeResult(instance.instance_id, kind, reason=verdict.reason, log=log),
            settings,
            started,
        )
    report = grade_statuses(
        verdict.statuses, instance.fail_to_pass, instance.pass_to_pass, instance.eval_type
    )
    result = GradeResult(
        instance.instance_id,
        GradeKind.GRADED,
        resolved=report.resolved,
        resolution=report.resolution,
        fail_to_pass=report.fail_to_pass,
        pass_to_pass=report.pass_to_pass,
        statuses=verdict.statuses,
        log=log,
    )
    return _finish(result, settings, started)


async def _bash(sandbox: AsyncSandbox, script: str, timeout: float) -> ExecResult:  # noqa: ASYNC109
    return await sandbox.exec(
        ["bash", "-c", script], timeout=timeout, max_output_bytes=MAX_LOG_BYTES
    )


async def _lay_out_repo(
    sandbox: AsyncSandbox, instance: SweInstance, settings: RunnerSettings
) -> str:
    """Write ``repo_files`` and commit them as the base; the error text, or "" when done."""
    for relative, text in instance.repo_files.items():
        await sandbox.write_file(f"{instance.workdir.rstrip('/')}/{relative}", text.encode())
    result = await _bash(
        sandbox,
        f"cd {shlex.quote(instance.workdir)} && git init -q && git add -A && "
        "git -c user.name=orchard -c user.email=orchard@localhost commit -qm base 2>&1",
        settings.apply_timeout_seconds,
    )
    return (
        ""
        if result.exit_code == 0
        else f"cannot lay out the repository: {result.stdout_text[-2000:]}"
    )


async def _apply_candidate(
    sandbox: AsyncSandbox, instance: SweInstance, settings: RunnerSettings
) -> tuple[str, str]:
    """(method that worked or "", the cascade's combined output)."""
    path = f"{STAGING_DIR}/candidate.patch"
    transcript: list[str] = []
    for name, template in APPLY_COMMANDS:
        command = f"cd {shlex.quote(instance.workdir)} && " + template.format(patch=path)
        result = await _bash(sandbox, f"{command} 2>&1", settings.apply_timeout_seconds)
        transcript.append(f"$ {template.format(patch=path)}\n{result.stdout_text}")
        if result.exit_code == 0 and not result.timed_out:
            return name, "\n".join(transcript)
    return "", "\n".join(transcript)


async def _run_in_sandbox(
    sandbox: AsyncSandbox, instance: SweInstance, patch: str, settings: RunnerSettings
) -> GradeResult:
    iid = instance.instance_id
    if instance.repo_files:
        problem = await _lay_out_repo(sandbox, instance, settings)
        if problem:
            return GradeResult(iid, GradeKind.INFRASTRUCTURE, reason=problem)
    await sandbox.write_file(f"{STAGING_DIR}/candidate.patch", patch.encode())
    await sandbox.write_file(f"{STAGING_DIR}/eval.sh", eval_script(instance).encode(), mode=0o755)
    method, transcript = await _apply_candidate(sandbox, instance, settings)
    if not method:
        return GradeResult(
            iid, GradeKind.PATCH_DOES_NOT_APPLY, reason=transcript[-4000:], log=transcript
        )
    if instance.test_patch:
        await sandbox.write_file(f"{STAGING_DIR}/test.patch", instance.test_patch.encode())
        applied = await _bash(
            sandbox,
            f"cd {shlex.quote(instance.workdir)} && git apply -v {STAGING_DIR}/test.patch 2>&1",
            settings.apply_timeout_seconds,
        )
        if applied.exit_code != 0:
            return GradeResult(
                iid,
                GradeKind.INFRASTRUCTURE,
                apply_method=method,
                reason=f"the instance's test patch does not apply: {applied.stdout_text[-2000:]}",
            )
    run = await _bash(sandbox, f"{STAGING_DIR}/eval.sh 2>&1", settings.test_timeout_seconds)
    log = run.stdout_text
    if run.timed_out:
        return GradeResult(
            iid,
            GradeKind.TIMEOUT,
            apply_method=method,
            reason=f"the test run exceeded {settings.test_timeout_seconds:g} s",
            log=log,
        )
    result = grade_log(instance, log, settings)
    result.apply_method = method
    if run.status.oom_killed:
        result.reason = (
            result.reason + "; " if result.reason else ""
        ) + "the test run was OOM-killed"
    if run.status.truncated:
        result.reason = (result.reason + "; " if result.reason else "") + "log truncated"
    return result


async def grade_patch_async(
    instance: SweInstance, output: str, settings: RunnerSettings | None = None
) -> GradeResult:
    """Grade a candidate (a patch or a whole agent output) against ``instance``'s tests."""
    settings = settings or RunnerSettings()
    started = time.monotonic()
    patch = extract_patch(output)
    if patch is None:
        return _finish(
            GradeResult(instance.instance_id, GradeKind.NO_PATCH, reason="no diff in the output"),
            settings,
            started,
        )
    sandbox: AsyncSandbox | None = None
    try:
        sandbox = await AsyncSandbox.create(
            image=instance.image,
            cpu=settings.cpu,
            memory=settings.memory,
            ttl=settings.sandbox_ttl_seconds,
            labels={"orchard.rewards": "swe", "instance": instance.instance_id[:63]},
            endpoint=settings.endpoint,
            api_key=settings.api_key,
        )
        result = await _run_in_sandbox(sandbox, instance, patch, settings)
    except OrchardError as exc:
        result = GradeResult(
            instance.instance_id,
            GradeKind.INFRASTRUCTURE,
            reason=f"{type(exc).__name__}: {exc.message}",
        )
    finally:
        if sandbox is not None:
            with contextlib.suppress(OrchardError):  # the TTL reaps it; grading has its answer
                await sandbox.delete()
    return _finish(result, settings, started)


def grade_patch(
    instance: SweInstance, output: str, settings: RunnerSettings | None = None
) -> GradeResult:
    """Synchronous :func:`grade_patch_async` for scripts and trainers without an event loop."""
    return asyncio.run(grade_patch_async(instance, output, settings))
