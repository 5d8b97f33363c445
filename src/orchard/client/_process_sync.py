"""The synchronous face of background processes: ``Process`` and the sandbox's calls.

``SandboxProcesses`` is mixed into :class:`~._sync.Sandbox` (``start``,
``terminal``, ``processes``, ``process``); every method builds its request
with :mod:`_processes` and makes one call through ``translate_errors``.
"""

from __future__ import annotations

import builtins
import time
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING

from orchard._proto.orchard.v1 import executor_pb2

from . import _requests
from ._core import translate_errors
from ._errors import DeadlineExceededError
from ._models import ExecResult
from ._processes import (
    DEFAULT_SHELL,
    WAIT_GRACE_SECONDS,
    WAIT_SLICE_SECONDS,
    ProcessCore,
    ProcessEvent,
    ProcessInfo,
    TerminalSize,
    process_info,
    start_request,
    wait_result,
)

if TYPE_CHECKING:
    from ._sync import Sandbox


class SandboxProcesses:
    """The background-process calls of a sync :class:`Sandbox`."""

    def start(
        self,
        cmd: _requests.Command,
        timeout: float | None = None,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        user: str | None = None,
        stdin: bool = False,
        pty: TerminalSize | None = None,
    ) -> Process:
        """Start ``cmd`` in the background and return its handle at once.

        It runs until it exits, its ``timeout`` passes or the sandbox goes, whatever
        the caller does (no stream is tied to it). ``stdin=True`` keeps its stdin open
        for :meth:`Process.write`; ``pty=(rows, cols)`` runs it on a terminal instead
        (see :meth:`terminal`).
        """
        sandbox: Sandbox = self  # type: ignore[assignment]
        start = sandbox._start(cmd, timeout, cwd, env, user, stdin=stdin)
        stub, access = sandbox._executor()
        with translate_errors():
            msg = stub.StartProcess(start_request(start, pty), metadata=access.metadata)
        return Process(sandbox, msg.process_id)

    def terminal(
        self,
        cmd: _requests.Command | None = None,
        rows: int = 24,
        cols: int = 80,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        user: str | None = None,
        timeout: float | None = None,
    ) -> Process:
        """A command on a pseudo-terminal allocated in the sandbox (default: a login
        shell, bash if the image has it). It is its controlling terminal: ``tty``,
        job control and Ctrl-C (write ``b"\\x03"``) work; ``resize`` sends SIGWINCH.
        Output is one stream (``stdout``), raw bytes with the terminal's escapes."""
        return self.start(
            list(DEFAULT_SHELL) if cmd is None else cmd,
            timeout,
            cwd,
            {"TERM": "xterm-256color", **(env or {})},
            user,
            pty=(rows, cols),
        )

    def processes(self) -> builtins.list[ProcessInfo]:
        """The sandbox's background processes: running ones and recently finished ones."""
        sandbox: Sandbox = self  # type: ignore[assignment]
        stub, access = sandbox._executor()
        with translate_errors():
            msg = stub.ListProcesses(
                executor_pb2.ListProcessesRequest(sandbox_id=sandbox.id), metadata=access.metadata
            )
        return [process_info(p) for p in msg.processes]

    def process(self, process_id: str) -> Process:
        """A handle on an existing process (from another client, or after a reconnect);
        raises :class:`ProcessError` if the sandbox has no such process."""
        handle = Process(self, process_id)  # type: ignore[arg-type]
        handle.info()
        return handle


class Process(ProcessCore):
    """A background process (or terminal) of a sandbox; see :meth:`Sandbox.start`."""

    def __init__(self, sandbox: Sandbox, process_id: str) -> None:
        super().__init__(sandbox.id, process_id)
        self.sandbox = sandbox

    def _call_wait(self, seconds: float) -> executor_pb2.WaitProcessResponse:
        stub, access = self.sandbox._executor()
        with translate_errors():
            return stub.WaitProcess(
                self._wait_request(seconds),
                metadata=access.metadata,
                timeout=seconds + WAIT_GRACE_SECONDS,
            )

    def _send(self, request: executor_pb2.ProcessInputRequest) -> None:
        stub, access = self.sandbox._executor()
        with translate_errors():
            stub.ProcessInput(request, metadata=access.metadata)

    def info(self) -> ProcessInfo:
        """Its state now (running, exited with its status, or lost)."""
        return process_info(self._call_wait(0).process)

    def output(self, offset: int | None = None, from_now: bool = False) -> Iterator[ProcessEvent]:
        """Its output as it comes, from ``offset`` (default: the start) or from now,
        ending with its :class:`ExecStatus`. An :class:`OutputDropped` first says how
        much older output the buffer no longer holds. Stopping the iteration only
        stops reading: the process runs on. ``self.offset`` follows what was read."""
        stub, access = self.sandbox._executor()
        call = stub.AttachProcess(self._attach_request(offset, from_now), metadata=access.metadata)
        try:
            with translate_errors():
                for msg in call:
                    event = self._seen(msg)
                    if event is not None:
                        yield event
        finally:
            call.cancel()  # type: ignore[no-untyped-call]

    def write(self, data: bytes | str) -> None:
        """Send bytes to its stdin (or terminal); a str is sent as UTF-8."""
        self._send(self._stdin_request(data))

    def close_stdin(self) -> None:
        """End its stdin (EOF). A terminal has no end of input: send ``b"\\x04"``."""
        self._send(self._input(close_stdin=True))

    def signal(self, signal: int) -> None:
        """Send ``signal`` to its process group."""
        self._send(self._signal_request(signal))

    def kill(self) -> None:
        """SIGKILL its process group."""
        self.signal(9)

    def resize(self, rows: int, cols: int) -> None:
        """Resize its terminal (the kernel sends it SIGWINCH)."""
        self._send(self._resize_request(rows, cols))

    def poll(self) -> ExecResult | None:
        """Its result if it has exited, else None (no wait)."""
        return wait_result(self._call_wait(0))

    def wait(self, timeout: float | None = None) -> ExecResult:
        """Wait until it exits and return its result (the output still buffered);
        :class:`DeadlineExceededError` (a ``TimeoutError``) after ``timeout`` seconds."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            left = WAIT_SLICE_SECONDS if deadline is None else deadline - time.monotonic()
            result = wait_result(self._call_wait(max(0.0, min(left, WAIT_SLICE_SECONDS))))
            if result is not None:
                return result
            if deadline is not None and time.monotonic() >= deadline:
                raise DeadlineExceededError(
                    f"process {self.id} still running after {timeout} s", code="DEADLINE_EXCEEDED"
                )
