"""The rollout runner: run harness H on task T in a fresh sandbox with a recorded model session.

One rollout, in order (each phase timed, ``result.detail["phases"]``)::

    session   create the proxy session (the tenant's key; metadata: task, harness)
    sandbox   create the sandbox (the task's image, network ``none`` unless told otherwise,
              the tools layer when the harness needs it)
    files     write task.files
    setup     run task.setup in task.workdir, then note the commit the agent starts from
    harness   harness.run(sandbox, task, endpoint, limits)
    diff      git diff of task.workdir against that commit (untracked files too, binary-safe)
    grade     grade(sandbox, task, run) -> reward, for a COMPLETED or TRUNCATED run only
    delete    the sandbox is deleted, whatever happened before (also when cancelled)
    finish    the session is finished with the reward and the fault
    samples   the session's training samples are fetched

Outcomes (``Status``): COMPLETED and TRUNCATED are the agent's (graded); ABORTED is anything
that is not the agent's doing, never graded and never a zero reward: the session is finished
with fault ``infrastructure`` (its samples are masked), and ``result.fault`` reads
``"<phase>: <what failed>"`` (``result.fault_phase`` is the phase).

A failing ``task.setup`` (a command exits non-zero or times out) is ABORTED too, with fault
``setup: ...``: the agent never acted, so there is nothing to score, and a broken task must
not be read as a policy's failure. It is told apart from the infrastructure's faults by its
phase (a setup command that could not be *run*, because the sandbox failed, is ``sandbox:``).

A harness that raises, or returns ``Status.ABORTED``, is ``harness:``. A harness that says it
finished although the session recorded model calls and the upstream answered none of them is
``proxy:`` (the endpoint was down: nothing the agent did can be scored). A harness that outlives
``limits.max_seconds`` plus ``RunnerOptions.grace_seconds`` is cancelled: TRUNCATED (a limit
stopped the agent; graded), its transcript lost (``detail["harness_timed_out"]``).

``run_rollouts`` runs many at once under a concurrency bound; every job yields a result in
the order given, and an unexpected error in one (a bug, not a fault: those are results
already) becomes that job's ABORTED result (``runner: ...``) without touching the others.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from orchard import AsyncOrchard, AsyncSandbox, NetworkPolicy, OrchardError, ToolsLayerNotBuiltError

from ._repo import DiffError, base_commit, final_diff
from ._types import Harness, HarnessRun, Limits, ModelEndpoint, RolloutResult, Status, Task
from .proxy import ModelProxyClient, ProxyError, ProxySession

log = logging.getLogger("orchard.rollouts")

Grader = Callable[[AsyncSandbox, Task, HarnessRun], Awaitable[float]]
"""``grade(sandbox, task, run) -> reward``: called with the sandbox as the agent left it."""


@dataclass(frozen=True)
class SandboxOptions:
    """How each rollout's sandbox is made.

    ``image`` overrides ``task.image`` (None and None: the server's default image).
    ``network`` is ``"none"`` by default: a harness reaches the model only through its
    session's endpoint. ``tools_layer``: mount the harness CLIs (None: when the harness says
    ``needs_tools_layer``). ``model_endpoint``: give the sandbox its model endpoint (a
    listener on its own loopback the node relays to the proxy, ``docs/model-endpoint.md``;
    None: when the harness runs inside the sandbox, :func:`runs_in_sandbox`); the session's
    URLs are then given to the harness with that endpoint's origin as ``*_in_sandbox``.
    ``proxy_url_in_sandbox`` overrides that origin (``scheme://host:port``: a deployment
    where sandboxes reach the proxy some other way). Without either, ``*_in_sandbox`` are
    the host's URLs, right for a harness whose loop runs in the driver's process. ``ttl`` is
    a safety net: the server deletes a sandbox the runner could not.
    """

    image: str | None = None
    network: str | NetworkPolicy = "none"
    cpu: float | str | None = None
    memory: int | str | None = None
    pids: int | None = None
    ttl: float | None = 4 * 3600.0
    labels: Mapping[str, str] = field(default_factory=dict)
    env: Mapping[str, str] = field(default_factory=dict)
    tools_layer: bool | None = None
    model_endpoint: bool | None = None
    proxy_url_in_sandbox: str | None = None
    create_timeout: float = 180.0
    wait_for_quota: float = 0.0
    template: str | None = None
    """Claim each sandbox from this template's warm pool (image, resources and network are
    the template's: ``image``, ``cpu``, ``memory``, ``pids`` and ``network`` are not sent);
    labels, env and ttl apply to the claim."""


@dataclass(frozen=True)
class RunnerOptions:
    """The runner's own limits: setup and git commands' timeouts, the diff cap, how long past
    ``limits.max_seconds`` a harness may run before it is cancelled."""

    setup_timeout: float = 900.0
    git_timeout: float = 120.0
    max_diff_bytes: int = 32 * 1024 * 1024
    grace_seconds: float = 60.0
    delete_timeout: float = 120.0


class _Aborted(Exception):
    """A phase failed: the rollout is ABORTED with ``phase: message``."""

    def __init__(self, phase: str, message: str) -> None:
        super().__init__(f"{phase}: {message}")
        self.phase = phase


def _describe(err: BaseException) -> str:
    text = str(err).strip()
    return f"{type(err).__name__}: {text}" if text else type(err).__name__


class _Clock:
    def __init__(self) -> None:
        self.phases: dict[str, float] = {}
        self.start = time.monotonic()

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        began = time.monotonic()
        try:
            yield
        finally:
            self.phases[name] = round(time.monotonic() - began, 4)

    @property
    def total(self) -> float:
        return round(time.monotonic() - self.start, 4)


def runs_in_sandbox(harness: Harness) -> bool:
    """Whether the harness's agent runs inside the sandbox (so it needs the model endpoint):
    its ``runs_in_sandbox`` attribute when it has one, else ``needs_tools_layer`` (a harness
    CLI of the tools layer runs in the sandbox; a loop in the driver's process needs neither)."""
    return bool(getattr(harness, "runs_in_sandbox", harness.needs_tools_layer))


def _label(value: str) -> str:
    return "".join(c if c.isprintable() else "?" for c in value)[:200]


def _with_origin(url: str, origin: str | None) -> str:
    """``url`` (``scheme://host:port/s/<credential>/...``) with ``origin`` for its first part."""
    if origin is None:
        return url
    scheme_end = url.index("://") + 3
    path_start = url.find("/", scheme_end)
    return origin.rstrip("/") + (url[path_start:] if path_start >= 0 else "")


def endpoint_for(session: ProxySession, model: str, in_sandbox: str | None) -> ModelEndpoint:
    """The :class:`ModelEndpoint` a harness is given for ``session``."""
    return ModelEndpoint(
        session_id=session.id,
        model=model,
        openai_base_url=session.openai_base_url,
        anthropic_base_url=session.anthropic_base_url,
        openai_base_url_in_sandbox=_with_origin(session.openai_base_url, in_sandbox),
        anthropic_base_url_in_sandbox=_with_origin(session.anthropic_base_url, in_sandbox),
    )


async def _create_sandbox(
    client: AsyncOrchard,
    task: Task,
    harness: Harness,
    session: ProxySession,
    options: SandboxOptions,
) -> AsyncSandbox:
    tools = harness.needs_tools_layer if options.tools_layer is None else options.tools_layer
    endpoint = (
        runs_in_sandbox(harness) if options.model_endpoint is None else options.model_endpoint
    )
    labels = {
        "orchard.rollouts/session": session.id,
        "orchard.rollouts/task": _label(task.id),
        "orchard.rollouts/harness": _label(harness.name),
        **options.labels,
    }
    try:
        if options.template is not None:
            return await client.sandboxes.create(
                template=options.template,
                ttl=options.ttl,
                labels=labels,
                env={**options.env, **task.env},
                request_id=f"rollout-{session.id}",
                timeout=options.create_timeout,
                wait_for_quota=options.wait_for_quota,
            )
        return await client.sandboxes.create(
            image=options.image or task.image,
            cpu=options.cpu,
            memory=options.memory,
            network=options.network,
            ttl=options.ttl,
            labels=labels,
            env={**options.env, **task.env},
            request_id=f"rollout-{session.id}",
            pids=options.pids,
            timeout=options.create_timeout,
            wait_for_quota=options.wait_for_quota,
            model_endpoint=endpoint,
            tools=tools,
        )
    except ToolsLayerNotBuiltError as err:  # the node lacks the harness CLIs: say so by name
        await _delete_leftovers(client, session)
        raise _Aborted("tools", f"create: {_describe(err)}") from err
    except OrchardError as err:
        await _delete_leftovers(client, session)
        raise _Aborted("sandbox", f"create: {_describe(err)}") from err


async def _delete_leftovers(client: AsyncOrchard, session: ProxySession) -> None:
    """A create that failed can leave its sandbox behind (FAILED, kept until deleted): find
    it by this rollout's label and delete it too."""
    with contextlib.suppress(OrchardError):
        for left in await client.sandboxes.list({"orchard.rollouts/session": session.id}):
            await client.sandboxes.delete(left.id)


async def _prepare(
    sandbox: AsyncSandbox, task: Task, runner: RunnerOptions, clock: _Clock
) -> str | None:
    """Write the files, run the setup; the commit the agent starts from (None: no repo)."""
    with clock.phase("files"):
        for path, data in task.files.items():
            try:
                await sandbox.write_file(path, data)
            except OrchardError as err:
                raise _Aborted("sandbox", f"write {path}: {_describe(err)}") from err
    with clock.phase("setup"):
        try:
            await sandbox.make_dir(task.workdir, parents=True)
        except OrchardError as err:
            raise _Aborted("sandbox", f"make {task.workdir}: {_describe(err)}") from err
        for command in task.setup:
            try:
                done = await sandbox.exec(
                    ["sh", "-c", command], cwd=task.workdir, timeout=runner.setup_timeout
                )
            except OrchardError as err:
                raise _Aborted("sandbox", f"setup {command!r}: {_describe(err)}") from err
            if done.timed_out:
                raise _Aborted("setup", f"{command!r} timed out after {runner.setup_timeout:g} s")
            if done.exit_code != 0:
                tail = (done.stderr_text or done.stdout_text)[-2000:].strip()
                raise _Aborted("setup", f"{command!r} exited {done.exit_code}: {tail}")
        try:
            return await base_commit(sandbox, task.workdir, runner.git_timeout)
        except OrchardError as err:
            raise _Aborted("sandbox", f"git rev-parse: {_describe(err)}") from err


async def _run_harness(
    harness: Harness,
    sandbox: AsyncSandbox,
    task: Task,
    endpoint: ModelEndpoint,
    limits: Limits,
    runner: RunnerOptions,
    detail: dict[str, Any],
) -> HarnessRun:
    try:
        async with asyncio.timeout(limits.max_seconds + runner.grace_seconds):
            run = await harness.run(sandbox, task, endpoint, limits)
    except TimeoutError:
        detail["harness_timed_out"] = True
        return HarnessRun(status=Status.TRUNCATED, fault=None,
                          detail={"why": f"cancelled after {limits.max_seconds:g} s + grace"})  # fmt: skip
    except Exception as err:
        raise _Aborted("harness", _describe(err)) from err
    if not isinstance(run, HarnessRun):
        raise _Aborted("harness", f"returned {type(run).__name__}, not a HarnessRun")
    if run.status is Status.ABORTED:
        raise _Aborted("harness", run.fault or "the harness reported ABORTED without a reason")
    return run


async def _grade(grade: Grader, sandbox: AsyncSandbox, task: Task, run: HarnessRun) -> float:
    try:
        reward = await grade(sandbox, task, run)
    except Exception as err:
        raise _Aborted("grade", _describe(err)) from err
    if isinstance(reward, bool) or not isinstance(reward, int | float) or not math.isfinite(reward):
        raise _Aborted("grade", f"returned {reward!r}, not a finite number")
    return float(reward)


async def _delete(sandbox: AsyncSandbox, seconds: float, detail: dict[str, Any]) -> None:
    """Delete, shielded from a cancellation of the rollout (a cancelled rollout still frees its
    sandbox); a failure is recorded (the sandbox's ttl is the safety net), never raised."""
    deletion = asyncio.ensure_future(asyncio.wait_for(sandbox.delete(), seconds))
    try:
        await asyncio.shield(deletion)
    except asyncio.CancelledError:
        with contextlib.suppress(BaseException):
            await deletion
        raise
    except Exception as err:
        detail["delete_error"] = _describe(err)
        log.warning("rollout: sandbox %s not deleted: %s", sandbox.id, _describe(err))


async def run_rollout(
    client: AsyncOrchard,
    harness: Harness,
    task: Task,
    *,
    proxy: ModelProxyClient,
    model: str,
    limits: Limits | None = None,
    grade: Grader | None = None,
    sandbox: SandboxOptions | None = None,
    runner: RunnerOptions | None = None,
    model_version: str = "",
    metadata: Mapping[str, Any] | None = None,
) -> RolloutResult:
    """Run ``harness`` on ``task`` in a fresh sandbox with a new session of ``proxy``.

    ``model`` is the model name the harness asks the proxy for; ``model_version`` the policy
    version recorded on every call; ``metadata`` goes into the session (with ``task`` and
    ``harness``). Never raises for a fault (an ABORTED result says which); cancelling it still
    deletes the sandbox and finishes the session.
    """
    limits = limits or Limits()
    options = sandbox or SandboxOptions()
    runner = runner or RunnerOptions()
    clock = _Clock()
    detail: dict[str, Any] = {"phases": clock.phases}
    result = RolloutResult(
        task_id=task.id, harness=harness.name, status=Status.ABORTED, steps=0, diff="",
        transcript=None, samples=[], session_id=None, detail=detail,
    )  # fmt: skip
    try:
        with clock.phase("session"):
            session = await proxy.create_session(
                model_version, {**(metadata or {}), "task": task.id, "harness": harness.name}
            )
    except ProxyError as err:
        result.fault = f"proxy: create session: {_describe(err)}"
        result.seconds = clock.total
        return result
    result.session_id = session.id
    reward: float | None = None
    try:
        await _sandbox_phases(client, proxy, harness, task, session, model, limits, grade,
                              options, runner, clock, result)  # fmt: skip
        reward = result.reward
    except _Aborted as err:
        result.status, result.fault, result.reward = Status.ABORTED, str(err), None
    except Exception as err:  # a bug of the runner or of a hook: still finish the session
        log.exception("rollout of %s: unexpected error", task.id)
        result.status, result.fault, result.reward = (
            Status.ABORTED,
            f"runner: {_describe(err)}",
            None,
        )
    except asyncio.CancelledError:
        current = asyncio.current_task()
        if current is not None and current.cancelling():
            result.status, result.fault, result.reward = Status.ABORTED, "runner: cancelled", None
            await _finish(proxy, session, None, result, clock)
            raise
        # nobody cancelled this rollout: a library turned an error into CancelledError (grpc.aio
        # does for a request stream that raised); it is this rollout's fault, not a cancellation
        log.exception("rollout of %s: CancelledError without a cancellation", task.id)
        result.status, result.reward = Status.ABORTED, None
        result.fault = "runner: CancelledError raised inside the rollout (not a cancellation)"
    await _finish(proxy, session, reward, result, clock)
    if result.status is not Status.ABORTED or result.fault_phase != "proxy":
        with clock.phase("samples"):
            try:
                result.samples = await proxy.samples(session.id)
            except ProxyError as err:
                detail["reward_before_fault"] = result.reward
                result.status, result.reward = Status.ABORTED, None
                result.fault = f"proxy: samples: {_describe(err)}"
    result.seconds = clock.total
    return result


async def _sandbox_phases(
    client: AsyncOrchard,
    proxy: ModelProxyClient,
    harness: Harness,
    task: Task,
    session: ProxySession,
    model: str,
    limits: Limits,
    grade: Grader | None,
    options: SandboxOptions,
    runner: RunnerOptions,
    clock: _Clock,
    result: RolloutResult,
) -> None:
    detail = result.detail
    with clock.phase("sandbox"):
        box = await _create_sandbox(client, task, harness, session, options)
    detail["sandbox_id"] = box.id
    try:
        base = await _prepare(box, task, runner, clock)
        detail["base_commit"] = base
        origin = options.proxy_url_in_sandbox
        if origin is None and box.last_info.model_endpoint:
            origin = box.last_info.model_endpoint
        elif origin is None and (
            options.model_endpoint or (options.model_endpoint is None and runs_in_sandbox(harness))
        ):
            raise _Aborted("sandbox", "created without the model endpoint it was asked for")
        endpoint = endpoint_for(session, model, origin)
        with clock.phase("harness"):
            run = await _run_harness(harness, box, task, endpoint, limits, runner, detail)
        result.status, result.steps = run.status, run.steps
        result.transcript, result.submission = run.transcript, run.submission
        if run.detail:
            detail["harness"] = dict(run.detail)
        if run.fault:
            detail["harness_fault"] = run.fault
        if run.status is not Status.ABORTED:
            await _check_model_answered(proxy, session)
        with clock.phase("diff"):
            if base is None:
                detail["diff_error"] = f"{task.workdir} is not a git work tree"
            else:
                try:
                    result.diff = await final_diff(
                        box, task.workdir, base, runner.git_timeout, runner.max_diff_bytes
                    )
                except DiffError as err:  # the agent's doing (it removed .git, ...): told
                    detail["diff_error"] = str(err)
                except OrchardError as err:
                    raise _Aborted("sandbox", f"git diff: {_describe(err)}") from err
        if grade is not None:
            with clock.phase("grade"):
                result.reward = await _grade(grade, box, task, run)
    finally:
        with clock.phase("delete"):
            await _delete(box, runner.delete_timeout, detail)


async def _check_model_answered(proxy: ModelProxyClient, session: ProxySession) -> None:
    """A harness that says it finished although none of its model calls was answered (the
    upstream down, every call refused) did not work the task: an infrastructure fault, not a
    zero reward. Harnesses differ in how they report a dead endpoint (some exit 0 after
    printing the error), so the session's own record decides."""
    try:
        info = await proxy.session(session.id)
    except ProxyError as err:
        raise _Aborted("proxy", f"session: {_describe(err)}") from err
    if info.calls and info.answered_calls == 0:
        raise _Aborted(
            "proxy", f"none of the rollout's {info.calls} model calls was answered by the upstream"
        )


async def _finish(
    proxy: ModelProxyClient,
    session: ProxySession,
    reward: float | None,
    result: RolloutResult,
    clock: _Clock,
) -> None:
    aborted = result.status is Status.ABORTED
    with clock.phase("finish"):
        try:
            info = await proxy.finish(
                session.id, None if aborted else reward,
                "infrastructure" if aborted else "", result.fault or "",
            )  # fmt: skip
        except ProxyError as err:
            if not aborted:
                result.detail["reward_before_fault"] = result.reward
                result.status, result.reward = Status.ABORTED, None
                result.fault = f"proxy: finish: {_describe(err)}"
            else:
                result.detail["finish_error"] = _describe(err)
            return
    result.detail["model_calls"] = info.calls


@dataclass(frozen=True)
class Job:
    """One rollout of :func:`run_rollouts`: a task and (optionally) its own harness and
    metadata; unset fields take ``run_rollouts``' arguments."""

    task: Task
    harness: Harness | None = None
    metadata: Mapping[str, Any] | None = None


async def run_rollouts(
    client: AsyncOrchard,
    harness: Harness,
    tasks: Sequence[Task | Job],
    *,
    proxy: ModelProxyClient,
    model: str,
    concurrency: int = 8,
    limits: Limits | None = None,
    grade: Grader | None = None,
    sandbox: SandboxOptions | None = None,
    runner: RunnerOptions | None = None,
    model_version: str = "",
    metadata: Mapping[str, Any] | None = None,
    on_result: Callable[[int, RolloutResult], None] | None = None,
) -> list[RolloutResult]:
    """Run every task (the same task several times for several samples), at most
    ``concurrency`` at once; the results in the order of ``tasks``. ``on_result(i, result)``
    is called as each finishes (progress, streaming to a trainer)."""
    if concurrency < 1:
        raise ValueError(f"concurrency must be at least 1, not {concurrency}")
    gate = asyncio.Semaphore(concurrency)
    jobs = [t if isinstance(t, Job) else Job(t) for t in tasks]

    async def one(index: int, job: Job) -> RolloutResult:
        agent = job.harness or harness
        async with gate:
            began = time.monotonic()
            try:
                result = await run_rollout(
                    client, agent, job.task, proxy=proxy, model=model, limits=limits,
                    grade=grade, sandbox=sandbox, runner=runner, model_version=model_version,
                    metadata={**(metadata or {}), **(job.metadata or {})},
                )  # fmt: skip
            except Exception as err:  # a bug of the runner: this job's, no other's
                log.exception("rollout %d (%s) failed in the runner", index, job.task.id)
                result = RolloutResult(
                    task_id=job.task.id, harness=str(getattr(agent, "name", "?")), status=Status.ABORTED, steps=0,
                    diff="", transcript=None, samples=[], session_id=None,
                    fault=f"runner: {_describe(err)}", seconds=time.monotonic() - began,
                )  # fmt: skip
        if on_result is not None:
            on_result(index, result)
        return result

    return list(await asyncio.gather(*(one(i, job) for i, job in enumerate(jobs))))
