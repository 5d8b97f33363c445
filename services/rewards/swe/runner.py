"""Running an instance's tests on a candidate patch in a fresh sandbox, through the SDK.

Steps (see ``eval_script``, ``witness``, ``completion`` and ``grading``):

1. take the patch out of the candidate output (none: ``NO_PATCH``, no sandbox);
   scan it with the static gate (``diff_gate``);
2. create a fresh sandbox from the instance's image;
3. upload the patch as a file and apply it with the cascade ``git apply`` ->
   ``git apply --reject`` -> ``patch --fuzz=5`` (all fail: ``PATCH_DOES_NOT_APPLY``);
4. put every test file and test-runner configuration the patch touched back
   to the base commit (``test_files``; flagged ``test_infrastructure_modified``);
5. upload and apply the instance's test patch (fails: ``INFRASTRUCTURE``: the
   instance is broken, not the candidate);
6. run the eval script under the witness (markers around the tests, the
   tests' exit code, pytest's junit report), with a time limit (hit: ``TIMEOUT``);
7. check the witness's nonce-bound record and the runner's completion record
   (fails: ``INVALID_LOG`` with ``forged_log`` / ``runner_incomplete``), grade
   the log as swebench does (not gradable: ``INVALID_LOG``), then apply the
   dataset's ``reward_policy`` to the findings (``gated``: not resolved);
8. delete the sandbox, whatever happened.

A platform error before the candidate's code runs (sandbox create, uploads,
the apply, an image without ``python3`` for the witness) is ``INFRASTRUCTURE``;
one during the test run is the run's if the sandbox still answers afterwards
(the candidate's code can kill the executor's helper; that must not turn a
failing run into a dropped sample).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import secrets
import shlex
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from orchard.client import AsyncOrchard, AsyncSandbox, ExecResult, OrchardError

from .completion import RunEvidence, check_completion, runner_family
from .diff_gate import HIGH, LOW, Finding, scan_patch, touched_paths
from .eval_script import APPLY_COMMANDS, eval_script
from .grading import END_MARKER, START_MARKER, Resolution, grade_statuses, read_log
from .instance import SweInstance
from .outcome import GradeKind, GradeResult
from .patch_extract import extract_patch
from .schemes import DEFAULT_F2P_WEIGHT, RewardScheme, reward_for
from .test_files import (
    command_files,
    infrastructure_reason,
    is_mixed_config,
    test_config_changed,
    test_id_files,
)
from .witness import (
    FORGED_LOG,
    RUNNER_INCOMPLETE,
    WitnessViolation,
    read_witnessed,
    witness_command,
)

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


TEST_INFRASTRUCTURE_MODIFIED = "test_infrastructure_modified"
GATED = "gated"


def _apply_policy(result: GradeResult, instance: SweInstance) -> None:
    """A finding the dataset's policy zeroes takes the resolution (and so the reward) away."""
    zeroing = instance.reward_policy.zeroing(result.findings)
    if not zeroing or result.kind is GradeKind.INFRASTRUCTURE:
        return
    result.integrity.append(GATED)
    result.resolved = False
    result.resolution = Resolution.NO
    note = "gated: " + "; ".join(f.render() for f in zeroing[:5])
    result.reason = f"{result.reason}; {note}" if result.reason else note


def _finish(result: GradeResult, settings: RunnerSettings, started: float) -> GradeResult:
    graded = result.kind in (GradeKind.GRADED,) and GATED not in result.integrity
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
    instance: SweInstance,
    log: str,
    settings: RunnerSettings | None = None,
    *,
    finish: bool = True,
) -> GradeResult:
    """Grade an eval log already produced (no sandbox): swebench's verdict plus our reward.

    A plain log carries no witness: this is swebench's grading and nothing more
    (the parity tests hold it to that). ``grade_patch`` checks the evidence first.
    ``finish=False`` leaves the reward to the caller.
    """
    settings = settings or RunnerSettings()
    started = time.monotonic()
    verdict = read_log(log, instance.log_parser)
    if not verdict.gradable:
        kind = GradeKind.TIMEOUT if verdict.reason == "tests_timed_out" else GradeKind.INVALID_LOG
        failed = GradeResult(instance.instance_id, kind, reason=verdict.reason, log=log)
        return _finish(failed, settings, started) if finish else failed
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
    return _finish(result, settings, started) if finish else result


async def _bash(sandbox: AsyncSandbox, script: str, timeout: float) -> ExecResult:  # noqa: ASYNC109
    return await sandbox.exec(
        ["bash", "-c", script], timeout=timeout, max_output_bytes=MAX_LOG_BYTES
    )


async def _lay_out_repo(
    sandbox: AsyncSandbox, instance: SweInstance, settings: RunnerSettings
) -> str:
    """Upload ``repo_files`` (one tar stream) and commit them as the base; the error text, or ""."""
    with tempfile.TemporaryDirectory(prefix="orchard-repo-") as tmp:
        root = Path(tmp)
        for (
            relative,
            text,
        ) in instance.repo_files.items():  # paths checked relative by parse_instance
            target = root / relative
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(text)
        await sandbox.upload(root, instance.workdir)
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


async def _git_text(
    sandbox: AsyncSandbox, instance: SweInstance, settings: RunnerSettings, ref_path: str
) -> str | None:
    """A file's text at the base commit (``HEAD:path``) or in the work tree (``path``); None: absent."""
    quoted = shlex.quote(ref_path)
    command = f"git show {quoted}" if ref_path.startswith("HEAD:") else f"cat -- {quoted}"
    result = await sandbox.exec(
        ["bash", "-c", f"cd {shlex.quote(instance.workdir)} && {command}"],
        timeout=settings.apply_timeout_seconds, max_output_bytes=MAX_LOG_BYTES,
    )  # fmt: skip
    return result.stdout_text if result.exit_code == 0 else None


async def _restore_test_infrastructure(
    sandbox: AsyncSandbox, instance: SweInstance, patch: str, settings: RunnerSettings
) -> tuple[list[Finding], str]:
    """Put the test files the candidate touched back to the base; (findings, error or "")."""
    named = test_id_files(instance.fail_to_pass + instance.pass_to_pass)
    named |= set(touched_paths(instance.test_patch)) if instance.test_patch else set()
    named |= command_files([instance.test_cmd, *instance.pre_commands])
    findings: list[Finding] = []
    for path in touched_paths(patch):
        reason = infrastructure_reason(path, named)
        severity = LOW if reason == "a test file" else HIGH
        if reason is None and is_mixed_config(path):
            before = await _git_text(sandbox, instance, settings, f"HEAD:{path}")
            after = await _git_text(sandbox, instance, settings, path)
            if test_config_changed(path, before, after):
                reason, severity = "changes the test runner's configuration", HIGH
        if reason is not None:
            findings.append(Finding(TEST_INFRASTRUCTURE_MODIFIED, severity, path, 0, reason))
    if not findings:
        return [], ""
    paths = " ".join(shlex.quote(f.path) for f in findings)
    script = (
        f"cd {shlex.quote(instance.workdir)} && git rev-parse --verify -q HEAD >/dev/null || "
        "{ echo 'the work directory is not a git repository at the base commit'; exit 3; }; "
        f'for p in {paths}; do if git cat-file -e HEAD:"$p" 2>/dev/null; then '
        'git checkout -q HEAD -- "$p" || exit 4; else rm -rf -- "$p" || exit 4; fi; done'
    )
    result = await _bash(sandbox, f"{script} 2>&1", settings.apply_timeout_seconds)
    if result.exit_code != 0:
        return findings, f"cannot restore the test files: {result.stdout_text[-2000:]}"
    return findings, ""


_HARNESS_LINE = ">>>>> "


def _witnessed_log(body: str, exit_code: int) -> str:
    """The eval script's own log, checked: its markers once each, the end ones last, the code bound."""
    lines = body.rstrip("\n").split("\n")
    harness = [line for line in lines if line.startswith(_HARNESS_LINE)]
    expected = [START_MARKER, END_MARKER, f">>>>> Test Exit Code: {exit_code}"]
    if harness in ([], [START_MARKER]):
        raise WitnessViolation(
            RUNNER_INCOMPLETE,
            "the eval script did not reach its end marker (killed or exited early)",
        )
    if harness != expected or lines[-2:] != expected[1:]:
        raise WitnessViolation(
            FORGED_LOG,
            "the test output carries harness marker lines of its own "
            f"({len(harness) - 3 if len(harness) >= 3 else len(harness)} extra or out of place)",
        )
    return body


async def _still_answers(sandbox: AsyncSandbox) -> bool:
    try:
        return (await sandbox.exec(["true"], timeout=30)).exit_code == 0
    except OrchardError:
        return False


async def _run_witnessed(
    sandbox: AsyncSandbox, instance: SweInstance, settings: RunnerSettings
) -> GradeResult:
    """Steps 6-7: the witnessed run and the checks of its evidence."""
    iid = instance.instance_id
    family = runner_family(instance.log_parser)
    report = f"{STAGING_DIR}/{secrets.token_hex(8)}/junit.xml" if family == "pytest" else ""
    if report:
        await sandbox.write_file(report.rsplit("/", 1)[0] + "/.keep", b"")
    try:
        run = await sandbox.exec(
            witness_command(f"{STAGING_DIR}/eval.sh", report),
            timeout=settings.test_timeout_seconds, max_output_bytes=MAX_LOG_BYTES,
        )  # fmt: skip
    except OrchardError as exc:
        if not await _still_answers(sandbox):
            raise
        return GradeResult(
            iid, GradeKind.INVALID_LOG, integrity=[RUNNER_INCOMPLETE],
            reason=f"{RUNNER_INCOMPLETE}: the test run's exec broke ({exc.message}) while the sandbox lived on",
        )  # fmt: skip
    output = run.stdout_text
    if run.timed_out:
        return GradeResult(
            iid, GradeKind.TIMEOUT, log=output,
            reason=f"the test run exceeded {settings.test_timeout_seconds:g} s",
        )  # fmt: skip
    try:
        record = read_witnessed(output, run.exit_code if run.status.signal == 0 else -1)
        log = _witnessed_log(record.body, record.exit_code)
        junit: bytes | None = None
        if record.report_digest is not None:
            junit = await sandbox.read_file(report)
            if hashlib.sha256(junit).hexdigest() != record.report_digest:
                raise WitnessViolation(
                    FORGED_LOG, "the junit report changed after the witness read it"
                )
        result = grade_log(instance, log, settings, finish=False)
        if result.kind in (GradeKind.GRADED, GradeKind.INVALID_LOG):
            section = log.split(START_MARKER, 1)[1].rsplit(END_MARKER, 1)[0]
            check_completion(
                RunEvidence(
                    section,
                    instance.log_parser,
                    result.statuses,
                    instance.fail_to_pass + instance.pass_to_pass,
                    record.exit_code,
                    junit,
                    junit_expected=bool(report),
                )
            )  # fmt: skip  (an ungradable log that also lacks the record says why: runner_incomplete)
    except WitnessViolation as violation:
        reason = f"{violation.flag}: {violation.reason}"
        if run.status.truncated:
            reason += "; log truncated"
        return GradeResult(
            iid, GradeKind.INVALID_LOG, integrity=[violation.flag], reason=reason, log=output
        )
    result.log = output
    if run.status.oom_killed:
        result.reason = (
            result.reason + "; " if result.reason else ""
        ) + "the test run was OOM-killed"
    return result


async def _grade_in_new_sandbox(
    client: AsyncOrchard, instance: SweInstance, patch: str, settings: RunnerSettings
) -> GradeResult:
    sandbox = await client.sandboxes.create(
        image=instance.image,
        cpu=settings.cpu,
        memory=settings.memory,
        ttl=settings.sandbox_ttl_seconds,
        labels={"orchard.rewards": "swe", "instance": instance.instance_id[:63]},
    )
    try:
        return await _run_in_sandbox(sandbox, instance, patch, settings)
    finally:
        with contextlib.suppress(OrchardError):  # the TTL reaps it; grading has its answer
            await sandbox.delete()


async def _has_python(sandbox: AsyncSandbox) -> bool:
    check = await sandbox.exec(["python3", "-I", "-S", "-c", "import ctypes, hashlib"], timeout=60)
    return check.exit_code == 0


async def _run_in_sandbox(
    sandbox: AsyncSandbox, instance: SweInstance, patch: str, settings: RunnerSettings
) -> GradeResult:
    iid = instance.instance_id
    if instance.repo_files:
        problem = await _lay_out_repo(sandbox, instance, settings)
        if problem:
            return GradeResult(iid, GradeKind.INFRASTRUCTURE, reason=problem)
    if not await _has_python(sandbox):
        return GradeResult(
            iid, GradeKind.INFRASTRUCTURE, reason="the image has no python3 for the run's witness"
        )
    await sandbox.write_file(f"{STAGING_DIR}/candidate.patch", patch.encode())
    script = eval_script(instance, exit_with_test_code=True)
    await sandbox.write_file(f"{STAGING_DIR}/eval.sh", script.encode(), mode=0o755)
    method, transcript = await _apply_candidate(sandbox, instance, settings)
    if not method:
        return GradeResult(
            iid, GradeKind.PATCH_DOES_NOT_APPLY, reason=transcript[-4000:], log=transcript
        )
    restored, problem = await _restore_test_infrastructure(sandbox, instance, patch, settings)
    if problem:
        return GradeResult(iid, GradeKind.INFRASTRUCTURE, apply_method=method, reason=problem)
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
    result = await _run_witnessed(sandbox, instance, settings)
    result.apply_method = method
    result.findings = restored + result.findings
    result.restored_files = [f.path for f in restored]
    if restored:
        result.integrity.append(TEST_INFRASTRUCTURE_MODIFIED)
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
    findings = scan_patch(patch)
    try:
        # One client per grade, under the caller's key (its quotas, its sandboxes).
        async with AsyncOrchard(settings.endpoint, settings.api_key) as client:
            result = await _grade_in_new_sandbox(client, instance, patch, settings)
    except OrchardError as exc:
        result = GradeResult(
            instance.instance_id,
            GradeKind.INFRASTRUCTURE,
            reason=f"{type(exc).__name__}: {exc.message}",
        )
    result.findings = result.findings + findings
    _apply_policy(result, instance)
    return _finish(result, settings, started)


def grade_patch(
    instance: SweInstance, output: str, settings: RunnerSettings | None = None
) -> GradeResult:
    """Synchronous :func:`grade_patch_async` for scripts and trainers without an event loop."""
    return asyncio.run(grade_patch_async(instance, output, settings))
