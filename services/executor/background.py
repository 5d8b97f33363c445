"""Background processes and terminals: commands no client stream is tied to.

An Exec's command lives as long as its stream: the stream ends, the init
connection closes, the shim kills the tree. Agents start servers, watchers
and long builds and come back to them later, from another client or after a
reconnect, so a :class:`BackgroundProcess` is owned by the executor instead:
it holds the init connection (the process dies with it: with the sandbox,
or when killed), reads the output into an :class:`~.output_ring.OutputRing`
that readers attach to from any offset, and keeps its result for a while
after it exits.

A terminal is the same thing with ``InitRequest.pty``: the shim allocates
the pseudo-terminal inside the sandbox (its devpts), the command gets its
slave as controlling terminal, and the executor holds the master: output is
read from it, stdin written to it, and a resize is one ``TIOCSWINSZ`` on it
(the kernel sends the SIGWINCH).

Bounds (all per node executor): live processes per sandbox / tenant / node
(a :class:`~.shares.ShareLedger` of counts, RESOURCE_EXHAUSTED past it);
each one's buffer (``buffer_bytes``) charged to the output ledger; finished
processes kept at most ``keep_finished`` per sandbox and ``keep_seconds``
each, then forgotten (NOT_FOUND). The executor restarting kills them (its
init connections close): they are not persisted.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import fcntl
import os
import secrets
import struct
import termios
import time
from collections.abc import Callable
from dataclasses import dataclass

from orchard._proto.orchard.v1 import executor_pb2 as pb
from orchard.common.errors import (
    ServiceError,
    infrastructure,
    invalid,
    not_found,
    precondition,
    quota_exceeded,
)

from .commands import PreparedExec, _OomWatch, drain, exec_status, start_failure_result
from .init_client import InitCommand, InitUnavailable, start_command
from .init_protocol import (
    STAGE_CHDIR,
    STAGE_CREDENTIALS,
    STAGE_EXEC,
    STAGE_PTY,
    ExitReport,
    StartFailure,
)
from .output_budget import OutputBudget, OutputCharge
from .output_ring import STDERR, STDOUT, OutputRing
from .pipes import InputPipe, OutputPipe
from .shares import Owner, ShareLedger, ShareLimits

UNCAPPED = 1 << 62
RETRY_AFTER_SECONDS = 5.0
MAX_TERMINAL_SIDE = 4096
# How often a sweep looks for finished processes of deleted sandboxes (a stat each).
GONE_CHECK_SECONDS = 10.0


@dataclass(frozen=True, slots=True)
class ProcessLimits:
    """How much background work the executor holds (settings.py says why each)."""

    shares: ShareLimits
    buffer_bytes: int
    keep_finished: int
    keep_seconds: float


class _PaceOnly(OutputCharge):
    """The tenant's output pace for a process's pipes; the ring charges the bytes."""

    def take(self, size: int) -> bool:
        return True


def check_pty_size(rows: int, cols: int) -> tuple[int, int]:
    if not (1 <= rows <= MAX_TERMINAL_SIDE and 1 <= cols <= MAX_TERMINAL_SIDE):
        raise invalid(f"terminal size {rows}x{cols}: rows and cols must be 1..{MAX_TERMINAL_SIDE}")
    return rows, cols


class BackgroundProcess:
    """One started process: its init connection, pipes, ring and result."""

    def __init__(
        self,
        process_id: str,
        prepared: PreparedExec,
        command: InitCommand,
        owner: Owner,
        ring: OutputRing,
        pace: OutputCharge,
        on_done: Callable[[BackgroundProcess], None],
    ) -> None:
        self.process_id = process_id
        self.socket_path = prepared.sandbox.socket_path
        self.sandbox_id = prepared.sandbox.sandbox_id
        self.owner = owner
        self.argv = prepared.request.argv
        self.pty = prepared.request.pty is not None
        self.pid = command.pid
        self.started_at = time.time()
        self.ended_at: float | None = None  # monotonic
        self.ring = ring
        self.status: pb.ExecStatus | None = None
        self.lost: str | None = None
        self.done = asyncio.Event()
        self._command = command
        loop = asyncio.get_running_loop()
        self._stdin: InputPipe | None = None
        self._pty_fd: int | None = None
        if self.pty:
            master = command.take_fd("pty_fd")
            self._pty_fd = os.dup(master)
            self._stdin = InputPipe(loop, self._pty_fd)
            self._pipes = [OutputPipe(loop, master, UNCAPPED, self._sink(STDOUT), pace)]
        else:
            if command.stdin_fd is not None:
                self._stdin = InputPipe(loop, command.take_fd("stdin_fd"))
            self._pipes = [
                OutputPipe(loop, command.take_fd("stdout_fd"), UNCAPPED, self._sink(STDOUT), pace),
                OutputPipe(loop, command.take_fd("stderr_fd"), UNCAPPED, self._sink(STDERR), pace),
            ]
        self._watch = _OomWatch(prepared.sandbox)
        self._on_done = on_done
        self._runner = loop.create_task(self._run())

    def _sink(self, stream: int) -> Callable[[bytes], None]:
        return lambda data: self.ring.append(stream, data)

    @property
    def state(self) -> str:
        if self.lost is not None:
            return "lost"
        return "running" if self.status is None else "exited"

    async def _run(self) -> None:
        try:
            report: ExitReport = await self._command.exited
            await drain(self._pipes)
            status = exec_status(report, None, None, self._watch.killed(report))
            dropped = self.ring.dropped > 0
            status.truncated = status.stdout_truncated = dropped
            status.stderr_truncated = dropped and not self.pty
            self.status = status
        except InitUnavailable as exc:
            self.lost = f"lost the sandbox's init: {exc}"
            self.ring.close()  # nobody can read a gone sandbox: free its bytes now
        finally:
            self.ended_at = time.monotonic()
            self._release_io()
            self.done.set()
            self.ring.notify()
            self._on_done(self)

    def _release_io(self) -> None:
        for pipe in self._pipes:
            pipe.close()
        if self._stdin is not None:
            self._stdin.close()
            self._stdin = None
        self._pty_fd = None  # closed by the InputPipe it belonged to
        self._command.close()

    # ---- input

    async def write(self, data: bytes) -> None:
        if self.state != "running":
            raise precondition(f"process {self.process_id} is not running", "PROCESS_STATE")
        if self._stdin is None:
            raise precondition(
                f"process {self.process_id} was started without stdin (start it with stdin)",
                "PROCESS_STATE",
            )
        await self._stdin.write(data)

    def close_stdin(self) -> None:
        if self.pty:
            raise precondition(
                "a terminal's input has no end; send b'\\x04' (Ctrl-D) or a signal",
                "PROCESS_STATE",
            )
        if self._stdin is not None:
            self._stdin.close()
            self._stdin = None

    def signal(self, signum: int) -> None:
        if not 1 <= signum <= 64:
            raise invalid(f"signal {signum} is not a valid signal number")
        if self.state == "running":
            self._command.signal(signum)

    def resize(self, rows: int, cols: int) -> None:
        rows, cols = check_pty_size(rows, cols)
        if not self.pty:
            raise precondition(f"process {self.process_id} has no terminal", "PROCESS_STATE")
        if self._pty_fd is None or self.state != "running":
            raise precondition(f"process {self.process_id} is not running", "PROCESS_STATE")
        size = struct.pack("HHHH", rows, cols, 0, 0)
        with contextlib.suppress(OSError):
            fcntl.ioctl(self._pty_fd, termios.TIOCSWINSZ, size)

    def kill(self) -> None:
        """SIGKILL the whole tree (sandbox gone or table closing)."""
        self._command.kill_tree()

    def close(self) -> None:
        """Kill it (closing the init connection kills the tree) and free the buffer."""
        if not self._runner.done():
            self._runner.cancel()
        self._release_io()
        self.ring.close()

    # ---- answers

    def info(self) -> pb.ProcessInfo:
        info = pb.ProcessInfo(
            sandbox_id=self.sandbox_id,
            process_id=self.process_id,
            argv=list(self.argv),
            started_at=self.started_at,
            state=self.state,
            pty=self.pty,
            pid=self.pid,
            output_bytes=self.ring.end,
            dropped_bytes=self.ring.dropped,
        )
        if self.status is not None:
            info.status.CopyFrom(self.status)
        return info

    async def wait(self, seconds: float) -> None:
        """Until it has ended, or ``seconds`` passed (0: do not wait)."""
        if seconds > 0 and not self.done.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.done.wait(), seconds)


class ProcessTable:
    """The node's background processes by id; finished ones kept for a while."""

    def __init__(self, limits: ProcessLimits, budget: OutputBudget) -> None:
        self._limits = limits
        self._budget = budget
        self._live = ShareLedger(limits.shares, "background processes")
        self._processes: dict[str, BackgroundProcess] = {}
        self._gone_checked = 0.0

    async def start(self, prepared: PreparedExec, owner: Owner) -> BackgroundProcess:
        self._sweep()
        refusal = self._live.refusal(owner, 1)
        if refusal is not None:
            raise quota_exceeded(
                f"no more background processes: {refusal}; wait for or kill some first",
                retry_after=RETRY_AFTER_SECONDS,
            )
        self._live.add(owner, 1)  # counted while it starts: concurrent starts cannot pass
        try:
            started = await start_command(prepared.sandbox.socket_path, prepared.request)
        except InitUnavailable as exc:
            self._live.remove(owner, 1)
            raise infrastructure(f"lost the sandbox's init: {exc}", "SANDBOX_NOT_READY") from exc
        except BaseException:
            self._live.remove(owner, 1)
            raise
        if isinstance(started, StartFailure):
            self._live.remove(owner, 1)
            raise _start_refused(prepared, started)
        ring = OutputRing(self._limits.buffer_bytes, self._budget.ledger, owner)
        pace = _PaceOnly(self._budget.ledger, owner, 1, self._budget.pace)
        process_id = f"p-{secrets.token_hex(8)}"
        try:
            process = BackgroundProcess(
                process_id, prepared, started, owner, ring, pace, self._finished
            )
        except BaseException:
            started.close()  # kills the command
            ring.close()
            self._live.remove(owner, 1)
            raise
        self._processes[process_id] = process
        return process

    def _finished(self, process: BackgroundProcess) -> None:
        self._live.remove(process.owner, 1)
        if process.lost is not None:
            # Its init is gone, so is the sandbox: nothing of it can be read any more.
            for other in list(self._processes.values()):
                if other.sandbox_id == process.sandbox_id and other.ended_at is not None:
                    self._forget(other)
            self._processes[process.process_id] = process  # its own "lost" answer stays

    def get(self, sandbox_id: str, process_id: str) -> BackgroundProcess:
        process = self._processes.get(process_id)
        if process is None or process.sandbox_id != sandbox_id:
            raise not_found(
                f"process {process_id[:80]!r} does not exist in sandbox {sandbox_id} "
                f"(finished processes are kept {self._limits.keep_seconds:.0f} s)",
                "PROCESS_NOT_FOUND",
            )
        return process

    def list(self, sandbox_id: str) -> list[BackgroundProcess]:
        self._sweep()
        found = [p for p in self._processes.values() if p.sandbox_id == sandbox_id]
        return sorted(found, key=lambda p: p.started_at)

    def _sweep(self) -> None:
        """Forget finished processes past their time, past the count per sandbox, and
        (checked every GONE_CHECK_SECONDS) those whose sandbox is gone."""
        now = time.monotonic()
        check_gone = now - self._gone_checked > GONE_CHECK_SECONDS
        if check_gone:
            self._gone_checked = now
        by_sandbox: dict[str, list[BackgroundProcess]] = collections.defaultdict(list)
        for process in list(self._processes.values()):
            if process.ended_at is None:
                continue
            gone = check_gone and not os.path.exists(process.socket_path)
            if gone or now - process.ended_at > self._limits.keep_seconds:
                self._forget(process)
            else:
                by_sandbox[process.sandbox_id].append(process)
        for finished in by_sandbox.values():
            finished.sort(key=lambda p: p.ended_at or 0.0)
            for process in finished[: max(0, len(finished) - self._limits.keep_finished)]:
                self._forget(process)

    def _forget(self, process: BackgroundProcess) -> None:
        self._processes.pop(process.process_id, None)
        process.ring.close()

    def close_all(self) -> None:
        for process in list(self._processes.values()):
            process.close()
            self._processes.pop(process.process_id, None)


def _start_refused(prepared: PreparedExec, failure: StartFailure) -> ServiceError:
    """A process that could not start is an error of the call (there is no stream
    to report a shell's 127 on, and a handle to a process that never ran would lie)."""
    if failure.stage == STAGE_PTY:
        return infrastructure(
            f"the sandbox could not allocate a terminal: {os.strerror(failure.errno)} "
            "(its /dev needs ptmx and a devpts at /dev/pts)"
        )
    code, message = start_failure_result(prepared, failure)
    reason = _START_REASONS.get(failure.stage, "EXECUTABLE_NOT_FOUND")
    return precondition(f"{message.decode(errors='replace').strip()} (exit {code})", reason)


_START_REASONS = {
    STAGE_EXEC: "EXECUTABLE_NOT_FOUND",
    STAGE_CREDENTIALS: "USER_NOT_FOUND",
    STAGE_CHDIR: "PATH_NOT_FOUND",
}
