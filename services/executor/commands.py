"""The exec engine: from an ExecStart to a started command, and its outcome.

:func:`prepare_exec` validates the request and resolves what orchard-init
needs (argv, env, cwd, numeric ids, timeout). :func:`run_exec` (unary Run)
and :class:`ExecStream` (bidirectional Exec) run it through the sandbox's
init and build the final :class:`ExecStatus`.

A command that cannot start is reported as a normal finished exec with a
shell's exit code and message (127 "command not found", 126 for permission
or working-directory problems), not as an RPC error: to the caller it is the
command that failed, as it would be in a shell.
"""

from __future__ import annotations

import asyncio
import dataclasses
import errno as errno_codes
import math
import os
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import grpc

from orchard._proto.orchard.v1 import executor_pb2 as pb
from orchard.common.errors import ServiceError, infrastructure, invalid
from orchard.common.exec_limits import exec_size_error
from orchard.common.exit_codes import returncode

from .arg_limits import check_exec_size
from .files import SandboxFiles
from .init_client import InitCommand, InitUnavailable, run_inline, start_command
from .init_protocol import (
    STAGE_CHDIR,
    STAGE_CREDENTIALS,
    STAGE_EXEC,
    ExitReport,
    InitRequest,
    StartFailure,
)
from .oom import read_oom_kills
from .output_budget import OutputCharge
from .pipes import CappedOutput, InputPipe, OutputPipe
from .sandboxes import Sandbox

# argv and env are bounded by the kernel's own execve rule (arg_limits.py), nothing
# stricter; init's request cap (init_protocol.MAX_REQUEST_BYTES) is above it.
MAX_CWD_BYTES = 4096
MAX_TIMEOUT_SECONDS = 30 * 24 * 3600.0

# After the command exits, how long to wait for its pipes to reach EOF: a
# background job (`server &`) may hold them open forever.
DRAIN_GRACE_SECONDS = 0.1

SIGKILL = 9

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class OutputLimits:
    """Per-stream output caps: the default and the most a request may ask."""

    default_bytes: int
    ceiling_bytes: int

    def for_request(self, requested: int) -> int:
        if requested < 0:
            raise invalid("max_output_bytes must not be negative")
        if requested == 0:
            return self.default_bytes
        return min(requested, self.ceiling_bytes)


@dataclass(frozen=True, slots=True)
class PreparedExec:
    """A validated request, ready for orchard-init."""

    sandbox: Sandbox
    request: InitRequest
    output_limit: int


def check_command_fields(start: pb.ExecStart) -> None:
    """Validation that needs no sandbox: run before looking anything up."""
    if start.argv and start.shell:
        raise invalid("set either argv or shell, not both")
    if not start.argv and not start.shell:
        raise invalid("argv or shell is required")
    if start.argv and not start.argv[0]:
        raise invalid("argv[0] must not be empty")
    if any("\0" in a for a in start.argv) or "\0" in start.shell:
        raise invalid("argv and shell must not contain NUL characters")
    check_env(start.env)
    # The ceiling any sandbox could accept (6 MiB), before the sandbox is looked up;
    # prepare_exec checks the sandbox's own limit with the whole environment.
    argv = list(start.argv) if start.argv else ["/bin/sh", "-c", start.shell]
    problem = exec_size_error(argv, [f"{k}={v}" for k, v in start.env.items()], None)
    if problem is not None:
        raise invalid(problem)
    check_cwd(start.cwd)
    check_timeout(start.timeout_seconds)


def check_env(env: Mapping[str, str]) -> None:
    """Names and values execve can pass (sizes: :func:`check_command_fields`)."""
    for name, value in env.items():
        if not name or "=" in name or "\0" in name or "\0" in value:
            raise invalid(
                f"env name {name[:60]!r} is invalid (empty, '=' or NUL) or its value has NUL"
            )


def check_cwd(cwd: str) -> None:
    if len(cwd) > MAX_CWD_BYTES or "\0" in cwd:
        raise invalid(f"cwd must be a path of at most {MAX_CWD_BYTES} characters without NUL")


def check_timeout(timeout_seconds: float) -> None:
    if not math.isfinite(timeout_seconds) or timeout_seconds < 0:
        raise invalid("timeout_seconds must be a finite number >= 0")
    if timeout_seconds > MAX_TIMEOUT_SECONDS:
        raise invalid(f"timeout_seconds must be at most {MAX_TIMEOUT_SECONDS:.0f}")


def timeout_ms(timeout_seconds: float) -> int:
    return math.ceil(timeout_seconds * 1000) if timeout_seconds > 0 else 0


async def command_env(
    sandbox: Sandbox, user_spec: str, request_env: Mapping[str, str]
) -> tuple[tuple[str, ...], int, int]:
    """The command's environment and numeric ids: sandbox env, then the
    user's HOME/USER/LOGNAME (when a user was named), then the request's env.

    The default user (root) needs no lookup; a named one is resolved in the
    sandbox's own /etc/passwd by the file service's confined reader, off the
    event loop (the sandbox controls those files and their size).
    """
    env = dict(sandbox.meta.env)
    uid = gid = 0
    if user_spec:
        uid, gid, home = await SandboxFiles(sandbox.rootfs).lookup_user(user_spec)
        name = user_spec.partition(":")[0]
        if not name.isdigit():
            env["USER"] = env["LOGNAME"] = name
        env["HOME"] = home
    env.update(request_env)
    return tuple(f"{k}={v}" for k, v in env.items()), uid, gid


def resolve_cwd(sandbox: Sandbox, cwd: str) -> str:
    base = sandbox.meta.cwd or "/"
    if not cwd:
        return base
    return os.path.normpath(os.path.join(base, cwd))


async def prepare_exec(
    sandbox: Sandbox, start: pb.ExecStart, limits: OutputLimits, stdin: bool
) -> PreparedExec:
    """Resolve a checked ExecStart against its sandbox."""
    argv = tuple(start.argv) if start.argv else ("/bin/sh", "-c", start.shell)
    env, uid, gid = await command_env(sandbox, start.user, start.env)
    # An executor serving root "/" runs inside its sandbox (injected): the meta's init pid
    # is a host pid, not one of its namespace, so its own limits are the sandbox's.
    init_pid = 0 if sandbox.rootfs == Path("/") else sandbox.meta.init_pid
    check_exec_size(argv, env, init_pid)
    request = InitRequest(
        argv=argv,
        env=env,
        cwd=resolve_cwd(sandbox, start.cwd),
        uid=uid,
        gid=gid,
        timeout_ms=timeout_ms(start.timeout_seconds),
        stdin=stdin,
    )
    return PreparedExec(sandbox, request, limits.for_request(start.max_output_bytes))


# ------------------------------------------------------------------ outcomes


def start_failure_result(prepared: PreparedExec, failure: StartFailure) -> tuple[int, bytes]:
    """The exit code and stderr a shell would give for a command that did not start."""
    name = prepared.request.argv[0]
    reason = os.strerror(failure.errno)
    if failure.stage == STAGE_EXEC:
        if failure.errno == errno_codes.ENOENT:
            if "/" in name:
                return 127, f"orchard: {name}: No such file or directory\n".encode()
            return 127, f"orchard: {name}: command not found\n".encode()
        return 126, f"orchard: {name}: {reason}\n".encode()
    if failure.stage == STAGE_CHDIR:
        cwd = prepared.request.cwd
        return 126, f"orchard: cannot change directory to {cwd}: {reason}\n".encode()
    if failure.stage == STAGE_CREDENTIALS:
        req = prepared.request
        return 126, f"orchard: cannot switch to uid {req.uid} gid {req.gid}: {reason}\n".encode()
    if failure.errno in (errno_codes.EAGAIN, errno_codes.ENOMEM, errno_codes.EMFILE):
        raise ServiceError(
            grpc.StatusCode.RESOURCE_EXHAUSTED,
            "SANDBOX_RESOURCE_LIMIT",
            f"the sandbox could not start the command (its process or memory limit?): {reason}",
            fault="task",
        )
    raise infrastructure(f"the sandbox's init could not start the command: {reason}")


def exec_status(
    report: ExitReport,
    stdout: OutputPipe | CappedOutput | None,
    stderr: OutputPipe | CappedOutput | None,
    oom_killed: bool,
) -> pb.ExecStatus:
    stdout_truncated = stdout is not None and stdout.truncated
    stderr_truncated = stderr is not None and stderr.truncated
    return pb.ExecStatus(
        exit_code=returncode(report.exit_code, report.signal),
        signal=report.signal,
        timed_out=report.timed_out,
        oom_killed=oom_killed,
        truncated=stdout_truncated or stderr_truncated,
        stdout_truncated=stdout_truncated,
        stderr_truncated=stderr_truncated,
        duration_seconds=report.duration_ns / 1e9,
    )


def _infrastructure_lost(exc: Exception) -> ServiceError:
    return infrastructure(f"lost the sandbox's init: {exc}", reason="SANDBOX_NOT_READY")


async def _start(prepared: PreparedExec) -> InitCommand | StartFailure:
    try:
        return await start_command(prepared.sandbox.socket_path, prepared.request)
    except InitUnavailable as exc:
        raise _infrastructure_lost(exc) from exc


class _OomWatch:
    """The memory cgroup's oom_kill counter before the command started."""

    def __init__(self, sandbox: Sandbox) -> None:
        self._cgroup = sandbox.meta.memory_cgroup
        self._before = read_oom_kills(self._cgroup) if self._cgroup else None

    def killed(self, report: ExitReport) -> bool:
        if self._before is None or report.signal != SIGKILL:
            return False
        after = read_oom_kills(self._cgroup)
        return after is not None and after > self._before


async def drain(pipes: list[OutputPipe]) -> None:
    """Wait briefly for EOF on every pipe, then stop reading the rest."""
    for p in pipes:
        p.unpause()
    pending = [p.eof for p in pipes if not p.closed]
    if pending:
        await asyncio.wait(pending, timeout=DRAIN_GRACE_SECONDS)
    for p in pipes:
        p.close()


async def unless_refused(work: Awaitable[T], charge: OutputCharge | None) -> T:
    """``work``'s result, or the charge's refusal as soon as the output stops fitting.

    On a refusal a task made here from a coroutine is cancelled (the inline
    reader then closes its connection, which kills the command's tree); a
    future passed in (a command's ``exited``) is left to its owner's close.
    """
    if charge is None:
        return await work
    owned = not isinstance(work, asyncio.Future)
    task = asyncio.ensure_future(work)
    refused = asyncio.ensure_future(charge.refused.wait())
    try:
        await asyncio.wait({task, refused}, return_when=asyncio.FIRST_COMPLETED)
        if charge.why is not None:
            raise charge.error()
        return task.result()
    finally:
        refused.cancel()
        if owned and not task.done():
            task.cancel()
            await asyncio.wait({task})


async def run_exec(
    prepared: PreparedExec, stdin: bytes, charge: OutputCharge | None = None
) -> pb.RunResponse:
    """Run to completion and return the whole (capped) output, charged to ``charge``."""
    if not prepared.request.stdin:
        return await _run_inline(prepared, charge)
    watch = _OomWatch(prepared.sandbox)
    started = await _start(prepared)
    if isinstance(started, StartFailure):
        code, message = start_failure_result(prepared, started)
        return pb.RunResponse(stderr=message, status=pb.ExecStatus(exit_code=code))
    command = started
    loop = asyncio.get_running_loop()
    stdout = OutputPipe(loop, command.take_fd("stdout_fd"), prepared.output_limit, charge=charge)
    stderr = OutputPipe(loop, command.take_fd("stderr_fd"), prepared.output_limit, charge=charge)
    feeder: asyncio.Task[None] | None = None
    try:
        if prepared.request.stdin:
            feeder = asyncio.create_task(_feed_stdin(loop, command.take_fd("stdin_fd"), stdin))
        try:
            report = await unless_refused(command.exited, charge)
        except InitUnavailable as exc:
            raise _infrastructure_lost(exc) from exc
        await drain([stdout, stderr])
        if charge is not None and charge.why is not None:
            raise charge.error()
        status = exec_status(report, stdout, stderr, watch.killed(report))
        return pb.RunResponse(stdout=stdout.data(), stderr=stderr.data(), status=status)
    finally:
        if feeder is not None and not feeder.done():
            feeder.cancel()
        stdout.close()
        stderr.close()
        command.close()


async def _run_inline(prepared: PreparedExec, charge: OutputCharge | None) -> pb.RunResponse:
    """A Run without stdin: the shim forwards the output on its connection
    (one socket, usually one wake-up, instead of three fds)."""
    watch = _OomWatch(prepared.sandbox)
    request = dataclasses.replace(prepared.request, inline_output=True)
    try:
        outcome = await unless_refused(
            run_inline(prepared.sandbox.socket_path, request, prepared.output_limit, charge),
            charge,
        )
    except InitUnavailable as exc:
        raise _infrastructure_lost(exc) from exc
    if isinstance(outcome, StartFailure):
        code, message = start_failure_result(prepared, outcome)
        return pb.RunResponse(stderr=message, status=pb.ExecStatus(exit_code=code))
    report = outcome.report
    status = exec_status(report, outcome.stdout, outcome.stderr, watch.killed(report))
    return pb.RunResponse(stdout=outcome.stdout.data(), stderr=outcome.stderr.data(), status=status)


async def _feed_stdin(loop: asyncio.AbstractEventLoop, fd: int, data: bytes) -> None:
    pipe = InputPipe(loop, fd)
    try:
        await pipe.write(data)
    finally:
        pipe.close()


class ExecStream:
    """One streaming exec: output events out, stdin and signals in.

    Events (``pb.ExecEvent``) are queued as the pipes produce them; the last
    one is always ``exit``. The queue is bounded by the output caps, since
    output past a cap is dropped before it is queued, and its bytes are
    charged to ``charge`` until the client takes them: a client that stops
    reading while its command floods ends with the charge's refusal.
    """

    def __init__(self, prepared: PreparedExec, charge: OutputCharge | None = None) -> None:
        self._prepared = prepared
        self._charge = charge
        self._events: asyncio.Queue[pb.ExecEvent | ServiceError | None] = asyncio.Queue()
        self._command: InitCommand | None = None
        self._stdin: InputPipe | None = None
        self._pipes: list[OutputPipe] = []
        self._runner: asyncio.Task[None] | None = None

    async def start(self) -> None:
        """Start the command (or queue the failure's stderr and exit)."""
        watch = _OomWatch(self._prepared.sandbox)
        started = await _start(self._prepared)
        if isinstance(started, StartFailure):
            code, message = start_failure_result(self._prepared, started)
            self._events.put_nowait(pb.ExecEvent(stderr=message))
            self._events.put_nowait(pb.ExecEvent(exit=pb.ExecStatus(exit_code=code)))
            self._events.put_nowait(None)
            return
        command = self._command = started
        loop = asyncio.get_running_loop()
        limit = self._prepared.output_limit
        charge = self._charge
        stdout = OutputPipe(loop, command.take_fd("stdout_fd"), limit, self._emit("stdout"), charge)
        stderr = OutputPipe(loop, command.take_fd("stderr_fd"), limit, self._emit("stderr"), charge)
        self._pipes = [stdout, stderr]
        if self._prepared.request.stdin:
            self._stdin = InputPipe(loop, command.take_fd("stdin_fd"))
        self._runner = asyncio.create_task(self._finish(command, stdout, stderr, watch))

    def _emit(self, stream: str) -> Callable[[bytes], None]:
        put = self._events.put_nowait
        if stream == "stdout":
            return lambda data: put(pb.ExecEvent(stdout=data))
        return lambda data: put(pb.ExecEvent(stderr=data))

    async def _finish(
        self, command: InitCommand, stdout: OutputPipe, stderr: OutputPipe, watch: _OomWatch
    ) -> None:
        try:
            report = await unless_refused(command.exited, self._charge)
            await drain([stdout, stderr])
            if self._charge is not None and self._charge.why is not None:
                raise self._charge.error()
            status = exec_status(report, stdout, stderr, watch.killed(report))
            self._events.put_nowait(pb.ExecEvent(exit=status))
        except ServiceError as exc:
            self._events.put_nowait(exc)
        except InitUnavailable as exc:
            self._events.put_nowait(_infrastructure_lost(exc))
        finally:
            self._events.put_nowait(None)

    async def next_event(self) -> pb.ExecEvent | None:
        """The next event; None after the exit event. Raises a lost-init error."""
        item = await self._events.get()
        if isinstance(item, ServiceError):
            raise item
        if item is not None and self._charge is not None:
            self._charge.give_back(len(item.stdout) + len(item.stderr))
        return item

    def fail(self, error: Exception) -> None:
        """End the stream with ``error`` (a bad request from the client)."""
        if isinstance(error, ServiceError):
            self._events.put_nowait(error)
        self.close()
        self._events.put_nowait(None)

    async def write_stdin(self, data: bytes) -> None:
        if self._stdin is not None:
            await self._stdin.write(data)

    def close_stdin(self) -> None:
        if self._stdin is not None:
            self._stdin.close()

    def signal(self, signum: int) -> None:
        if not 1 <= signum <= 64:
            raise invalid(f"signal {signum} is not a valid signal number")
        if self._command is not None:
            self._command.signal(signum)

    def close(self) -> None:
        """Release everything; a command still running is killed (tree)."""
        if self._runner is not None and not self._runner.done():
            self._runner.cancel()
        if self._stdin is not None:
            self._stdin.close()
        for pipe in self._pipes:
            pipe.close()
        if self._command is not None:
            self._command.close()
