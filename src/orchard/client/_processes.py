"""Background processes and terminals: what the sync and async handles share.

``sandbox.start(cmd)`` returns a handle on a command that runs on without
any stream tied to it (a server, a watcher, a long build); ``sandbox.terminal()``
does the same on a pseudo-terminal. The executor keeps each process's output
in a bounded buffer (1 MiB by default, both streams; past it the oldest
bytes are dropped), so a reader can come back from any client, read from
the start (told how many bytes it missed, :class:`OutputDropped`) or from
where it stopped (``handle.offset``), and the result stays readable for a
while after the process exits. This module holds the models, the request
builders and the event conversion; ``_process_sync`` / ``_process_async``
add the calls.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Literal

from orchard._proto.orchard.v1 import executor_pb2

from ._errors import InfrastructureError, InvalidRequestError
from ._models import ExecResult, ExecStatus, OutputChunk, exec_result, exec_status

ProcessState = Literal["running", "exited", "lost"]
# One WaitProcess call waits at most this long; a longer wait is several calls,
# so no proxy's idle timeout ends it.
WAIT_SLICE_SECONDS = 60.0
# Added to a WaitProcess's own wait to get the call deadline.
WAIT_GRACE_SECONDS = 30.0
TerminalSize = tuple[int, int]


@dataclass(frozen=True)
class ProcessInfo:
    """A background process as the executor describes it (``sandbox.processes()``)."""

    id: str
    argv: tuple[str, ...]
    started_at: dt.datetime
    state: ProcessState
    """"running", "exited", or "lost" (the sandbox's init went away)."""
    pid: int
    """Its pid inside the sandbox."""
    pty: bool
    status: ExecStatus | None
    """How it ended, once it has."""
    output_bytes: int
    """Bytes written so far (both streams)."""
    dropped_bytes: int
    """How many of the oldest the bounded buffer no longer holds."""


@dataclass(frozen=True)
class OutputDropped:
    """``bytes`` of output before this point were dropped from the buffer (it
    overflowed before this reader came): they cannot be read any more."""

    bytes: int


ProcessEvent = OutputChunk | OutputDropped | ExecStatus


def process_info(msg: executor_pb2.ProcessInfo) -> ProcessInfo:
    state = msg.state if msg.state in ("running", "exited", "lost") else "lost"
    return ProcessInfo(
        id=msg.process_id,
        argv=tuple(msg.argv),
        started_at=dt.datetime.fromtimestamp(msg.started_at, tz=dt.UTC),
        state=state,  # type: ignore[arg-type]
        pid=msg.pid,
        pty=msg.pty,
        status=exec_status(msg.status) if msg.HasField("status") else None,
        output_bytes=msg.output_bytes,
        dropped_bytes=msg.dropped_bytes,
    )


def process_event(msg: executor_pb2.ProcessEvent) -> ProcessEvent | None:
    kind = msg.WhichOneof("kind")
    if kind == "stdout":
        return OutputChunk("stdout", msg.stdout)
    if kind == "stderr":
        return OutputChunk("stderr", msg.stderr)
    if kind == "dropped":
        return OutputDropped(msg.dropped)
    if kind == "exit":
        return exec_status(msg.exit)
    return None


def wait_result(msg: executor_pb2.WaitProcessResponse) -> ExecResult | None:
    """The process's result once it has exited (the existing result conversion:
    exit code and signal follow the SDK's convention), else None."""
    if msg.process.state == "lost":
        raise InfrastructureError(
            f"process {msg.process.process_id}: the sandbox's init went away",
            code="UNAVAILABLE",
            fault="infrastructure",
        )
    if msg.process.state != "exited":
        return None
    return exec_result(
        executor_pb2.RunResponse(stdout=msg.stdout, stderr=msg.stderr, status=msg.process.status)
    )


def pty_size(size: TerminalSize) -> executor_pb2.PtySize:
    rows, cols = size
    if not (isinstance(rows, int) and isinstance(cols, int) and rows > 0 and cols > 0):
        raise InvalidRequestError(f"a terminal size is (rows, cols) > 0, not {size!r}")
    return executor_pb2.PtySize(rows=rows, cols=cols)


def start_request(
    start: executor_pb2.ExecStart, pty: TerminalSize | None
) -> executor_pb2.StartProcessRequest:
    request = executor_pb2.StartProcessRequest(start=start)
    if pty is not None:
        request.pty.CopyFrom(pty_size(pty))
    return request


DEFAULT_SHELL = (
    "/bin/sh",
    "-c",
    "if command -v bash >/dev/null 2>&1; then exec bash -l; else exec sh -l; fi",
)
"""What ``terminal()`` runs by default: bash when the image has it, else sh (login shells)."""


class ProcessCore:
    """A process handle without I/O: its ids and its requests."""

    def __init__(self, sandbox_id: str, process_id: str) -> None:
        self.sandbox_id = sandbox_id
        self.id = process_id
        self.offset = 0
        """The output offset just after the last event an ``output()`` gave: pass it
        as ``output(offset=...)`` to go on where a lost reader stopped."""

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.id} of {self.sandbox_id}>"

    def _attach_request(
        self, offset: int | None, from_now: bool
    ) -> executor_pb2.AttachProcessRequest:
        if offset is not None and offset < 0:
            raise InvalidRequestError("offset must be >= 0")
        return executor_pb2.AttachProcessRequest(
            sandbox_id=self.sandbox_id,
            process_id=self.id,
            offset=offset or 0,
            from_now=from_now,
        )

    def _input(self, **kind: object) -> executor_pb2.ProcessInputRequest:
        return executor_pb2.ProcessInputRequest(
            sandbox_id=self.sandbox_id,
            process_id=self.id,
            **kind,  # type: ignore[arg-type]
        )

    def _stdin_request(self, data: bytes | str) -> executor_pb2.ProcessInputRequest:
        return self._input(stdin=data.encode() if isinstance(data, str) else bytes(data))

    def _signal_request(self, signal: int) -> executor_pb2.ProcessInputRequest:
        if not 1 <= signal <= 64:
            raise InvalidRequestError(f"signal {signal} is not 1..64")
        return self._input(signal=signal)

    def _resize_request(self, rows: int, cols: int) -> executor_pb2.ProcessInputRequest:
        return self._input(resize=pty_size((rows, cols)))

    def _wait_request(self, seconds: float) -> executor_pb2.WaitProcessRequest:
        return executor_pb2.WaitProcessRequest(
            sandbox_id=self.sandbox_id, process_id=self.id, timeout_seconds=max(0.0, seconds)
        )

    def _seen(self, msg: executor_pb2.ProcessEvent) -> ProcessEvent | None:
        self.offset = max(self.offset, msg.offset)
        return process_event(msg)
