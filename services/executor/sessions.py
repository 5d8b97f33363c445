"""Persistent shell sessions: one long-lived bash per session, one command at a time.

A session is a bash started through orchard-init with SESSION_FDS (see
:mod:`session_shell` for the loop it runs, and why its results cannot be
forged). :class:`ShellSession` sends one command, waits for its exit code on
fd 3, then sends a fresh end marker and waits for it on stdout and stderr,
and handles interrupts, timeouts and the shell exiting.
:class:`SessionTable` holds the node's sessions by id, each charged to its
owner's share (:mod:`shares`: per sandbox, per tenant, per node; one over is
RESOURCE_EXHAUSTED / QUOTA_EXCEEDED), so one tenant's session flood leaves
room for the others. A command's kept output is charged to the call's
output budget (:mod:`output_budget`); output that does not fit is dropped
and the call is refused once the command has ended.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import errno as errno_codes
import secrets
import time

from orchard._proto.orchard.v1 import executor_pb2 as pb
from orchard.common.errors import infrastructure, invalid, not_found, precondition, quota_exceeded
from orchard.common.exit_codes import returncode

from .commands import PreparedExec, start_failure_result
from .init_client import InitCommand, InitUnavailable, start_command
from .init_protocol import STAGE_EXEC, ExitReport, InitRequest, StartFailure
from .output_budget import OutputCharge
from .pipes import InputPipe, OutputPipe
from .sandboxes import Sandbox
from .session_shell import MarkedStream, new_marker, session_argv
from .shares import Owner, ShareLedger, ShareLimits

SIGINT = 2
# How long an interrupted (timed-out) command may take to stop before the
# whole session is killed.
INTERRUPT_GRACE_SECONDS = 2.0
# After the shell exits, how long to wait for its pipes to reach EOF.
EXIT_DRAIN_SECONDS = 0.1
MAX_COMMAND_BYTES = 1 << 20
SESSION_RETRY_AFTER_SECONDS = 5.0
# Ended sessions remembered so a later call gets SESSION_DEAD, not NOT_FOUND.
MAX_TOMBSTONES = 1024


class ShellSession:
    """One running session shell."""

    def __init__(
        self, session_id: str, sandbox: Sandbox, command: InitCommand, owner: Owner
    ) -> None:
        self.session_id = session_id
        self.sandbox_id = sandbox.sandbox_id
        self.owner = owner
        self._command = command
        loop = asyncio.get_running_loop()
        self._stdout = MarkedStream()
        self._stderr = MarkedStream()
        self._marker_sent = True
        self._marker_write: asyncio.Task[None] | None = None
        self._status_text = bytearray()
        self._statuses: collections.deque[int] = collections.deque()
        self._progress: asyncio.Event = asyncio.Event()
        unlimited = 1 << 62
        self._pipes = [
            OutputPipe(loop, command.take_fd("stdout_fd"), unlimited, self._on_stdout),
            OutputPipe(loop, command.take_fd("stderr_fd"), unlimited, self._on_stderr),
            OutputPipe(loop, command.take_fd("status_fd"), unlimited, self._on_status),
        ]
        self._control = InputPipe(loop, command.take_fd("control_fd"))
        self.busy = False
        self._settling = False
        self.dead_reason: str | None = None
        command.exited.add_done_callback(self._on_exit)

    # -- pipe callbacks: record progress and wake the running command's waiter

    def _on_stdout(self, data: bytes) -> None:
        self._stdout.feed(data)
        self._progress.set()

    def _on_stderr(self, data: bytes) -> None:
        self._stderr.feed(data)
        self._progress.set()

    def _on_status(self, data: bytes) -> None:
        self._status_text += data
        while (end := self._status_text.find(b"\0")) >= 0:
            text = bytes(self._status_text[:end])
            del self._status_text[: end + 1]
            self._statuses.append(int(text) if text.isdigit() else 255)
        if self._statuses and not self._marker_sent:
            self._send_marker()
        self._progress.set()

    def _send_marker(self) -> None:
        """The command's status is in: only now does its end marker exist."""
        self._marker_sent = True
        marker = new_marker()
        self._stdout.expect(marker)
        self._stderr.expect(marker)
        self._marker_write = asyncio.get_running_loop().create_task(
            self._control.write(marker + b"\0")
        )

    def _on_exit(self, fut: asyncio.Future[ExitReport]) -> None:
        if self.dead_reason is None:
            if fut.cancelled() or fut.exception() is not None:
                self.dead_reason = "the session's shell was lost"
            else:
                report = fut.result()
                how = (
                    f"code {report.exit_code}" if report.signal == 0 else f"signal {report.signal}"
                )
                self.dead_reason = f"the session's shell exited ({how})"
        self._progress.set()
        if not self.busy:
            self._release()

    def _complete(self) -> bool:
        return self._stdout.found and self._stderr.found and bool(self._statuses)

    async def _wait_complete(self, deadline: float | None) -> bool:
        """True once the command's markers and status arrived; False on the
        deadline or when the shell died first."""
        while not self._complete():
            if self._command.exited.done():
                return False
            self._progress.clear()
            if deadline is None:
                await self._progress.wait()
                continue
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._progress.wait(), remaining)
        return True

    async def run(
        self, text: str, timeout_seconds: float, limit: int, charge: OutputCharge | None = None
    ) -> pb.RunResponse:
        """Run one command in the shell (SESSION_BUSY if one is running)."""
        if self.busy:
            raise precondition(
                f"session {self.session_id} is already running a command", "SESSION_BUSY"
            )
        if self.dead_reason is not None:
            raise precondition(
                f"session {self.session_id} has ended: {self.dead_reason}", "SESSION_DEAD"
            )
        self.busy = True
        started = time.monotonic()
        try:
            self._stdout.begin(limit, charge)
            self._stderr.begin(limit, charge)
            self._statuses.clear()
            self._marker_sent = False
            await self._control.write(text.encode("utf-8", "surrogateescape") + b"\0")
            deadline = started + timeout_seconds if timeout_seconds > 0 else None
            try:
                done = await self._wait_complete(deadline)
            except asyncio.CancelledError:
                # The caller went away: stop the command, then free the session.
                self._command.signal(SIGINT)
                asyncio.get_running_loop().create_task(self._settle_after_cancel())
                raise
            timed_out = False
            if not done and not self._command.exited.done():
                # Timed out: interrupt, and kill the session if that is not enough.
                timed_out = True
                self._command.signal(SIGINT)
                done = await self._wait_complete(time.monotonic() + INTERRUPT_GRACE_SECONDS)
                if not done and not self._command.exited.done():
                    self.dead_reason = "killed: a command timed out and ignored SIGINT"
                    self._command.kill_tree()
                    with contextlib.suppress(InitUnavailable):
                        await asyncio.wait_for(asyncio.shield(self._command.exited), 5)
            duration = time.monotonic() - started
            if charge is not None and charge.why is not None:
                self._stdout.take()
                self._stderr.take()
                raise charge.error()
            if done:
                code = self._statuses.popleft()
                return self._response(code, 0, timed_out, duration)
            return await self._shell_ended(timed_out, duration)
        finally:
            if not self._settling:
                self.busy = False
                if self.dead_reason is not None:
                    self._release()

    async def _settle_after_cancel(self) -> None:
        self._settling = True
        try:
            done = await self._wait_complete(time.monotonic() + INTERRUPT_GRACE_SECONDS)
            if not done and self.dead_reason is None:
                self.dead_reason = "killed: a cancelled command ignored SIGINT"
                self._command.kill_tree()
        finally:
            self._settling = False
            self.busy = False
            if self.dead_reason is not None:
                self._release()

    async def _shell_ended(self, timed_out: bool, duration: float) -> pb.RunResponse:
        """The shell died during the command (``exit``, killed, timeout)."""
        pending = [p.eof for p in self._pipes[:2] if not p.closed]
        if pending:
            await asyncio.wait(pending, timeout=EXIT_DRAIN_SECONDS)
        try:
            report = await asyncio.wait_for(asyncio.shield(self._command.exited), 5)
        except (InitUnavailable, TimeoutError):
            report = ExitReport(-1, 9, False, 0)
        return self._response(report.exit_code, report.signal, timed_out, duration)

    def _response(self, code: int, signal: int, timed_out: bool, duration: float) -> pb.RunResponse:
        stdout = self._stdout.take()
        stderr = self._stderr.take()
        if self.dead_reason is not None:
            stderr += f"\norchard: session ended: {self.dead_reason}\n".encode()
        status = pb.ExecStatus(
            exit_code=returncode(code, signal),
            signal=signal,
            timed_out=timed_out,
            truncated=self._stdout.truncated or self._stderr.truncated,
            stdout_truncated=self._stdout.truncated,
            stderr_truncated=self._stderr.truncated,
            duration_seconds=duration,
        )
        return pb.RunResponse(stdout=stdout, stderr=stderr, status=status)

    def interrupt(self) -> None:
        """SIGINT to the running command; the shell traps it and survives."""
        if self.busy and self.dead_reason is None:
            self._command.signal(SIGINT)

    def close(self) -> None:
        """Kill the shell and everything it started."""
        if self.dead_reason is None:
            self.dead_reason = "the session was closed"
        self._release()

    def _release(self) -> None:
        self._control.close()
        for pipe in self._pipes:
            pipe.close()
        self._command.close()


class SessionTable:
    """The node's live sessions by id, and recently ended ones."""

    def __init__(self, limits: ShareLimits) -> None:
        self._shares = ShareLedger(limits, "sessions")
        self._live: dict[str, ShellSession] = {}
        self._ended: collections.OrderedDict[str, tuple[str, str]] = collections.OrderedDict()

    async def create(self, prepared: PreparedExec, owner: Owner) -> ShellSession:
        self._sweep()
        refusal = self._shares.refusal(owner, 1)
        if refusal is not None:
            raise quota_exceeded(
                f"no more sessions: {refusal}; close some first",
                retry_after=SESSION_RETRY_AFTER_SECONDS,
            )
        # Counted while it starts, so concurrent creates cannot pass the share together.
        self._shares.add(owner, 1)
        try:
            return await self._start(prepared, owner)
        except BaseException:
            self._shares.remove(owner, 1)
            raise

    async def _start(self, prepared: PreparedExec, owner: Owner) -> ShellSession:
        request = InitRequest(
            argv=session_argv(),
            env=prepared.request.env,
            cwd=prepared.request.cwd,
            uid=prepared.request.uid,
            gid=prepared.request.gid,
            session_fds=True,
            new_session=True,
        )
        try:
            started = await start_command(prepared.sandbox.socket_path, request)
        except InitUnavailable as exc:
            raise _lost(exc) from exc
        if isinstance(started, StartFailure):
            if started.stage == STAGE_EXEC and started.errno == errno_codes.ENOENT:
                raise precondition(
                    "this sandbox's image has no bash; sessions need bash", "EXECUTABLE_NOT_FOUND"
                )
            _, message = start_failure_result(PreparedExec(prepared.sandbox, request, 0), started)
            raise precondition(message.decode().strip(), "SESSION_DEAD")
        session_id = f"s-{secrets.token_hex(8)}"
        session = ShellSession(session_id, prepared.sandbox, started, owner)
        self._live[session_id] = session
        return session

    def get(self, sandbox_id: str, session_id: str) -> ShellSession:
        """A live session of ``sandbox_id``, or SESSION_NOT_FOUND / SESSION_DEAD."""
        session = self._live.get(session_id)
        if session is not None and session.sandbox_id == sandbox_id:
            if session.dead_reason is not None and not session.busy:
                self._bury(session)
            else:
                return session
        ended = self._ended.get(session_id)
        if ended is not None and ended[0] == sandbox_id:
            raise precondition(f"session {session_id} has ended: {ended[1]}", "SESSION_DEAD")
        raise not_found(
            f"session {session_id[:80]!r} does not exist in sandbox {sandbox_id}",
            "SESSION_NOT_FOUND",
        )

    def close(self, sandbox_id: str, session_id: str) -> None:
        session = self._live.get(session_id)
        if session is None or session.sandbox_id != sandbox_id:
            self.get(sandbox_id, session_id)  # raises the right error
            return
        session.close()
        # Closed on request: later calls get SESSION_NOT_FOUND, not SESSION_DEAD.
        self._forget(session)

    def _forget(self, session: ShellSession) -> None:
        if self._live.pop(session.session_id, None) is not None:
            self._shares.remove(session.owner, 1)

    def _bury(self, session: ShellSession) -> None:
        self._forget(session)
        self._ended[session.session_id] = (session.sandbox_id, session.dead_reason or "ended")
        while len(self._ended) > MAX_TOMBSTONES:
            self._ended.popitem(last=False)

    def _sweep(self) -> None:
        for session in [s for s in self._live.values() if s.dead_reason and not s.busy]:
            self._bury(session)

    def close_all(self) -> None:
        for session in list(self._live.values()):
            session.close()
            self._forget(session)


def check_session_command(text: str) -> None:
    if not text:
        raise invalid("command is required")
    if "\0" in text:
        raise invalid("command must not contain NUL characters")
    if len(text) > MAX_COMMAND_BYTES:
        raise invalid(f"command is {len(text)} characters; the limit is {MAX_COMMAND_BYTES}")


def _lost(exc: Exception) -> Exception:
    return infrastructure(f"lost the sandbox's init: {exc}", reason="SANDBOX_NOT_READY")
