"""The asyncio face of background processes: ``AsyncProcess`` and the sandbox's calls.

``AsyncSandboxProcesses`` is mixed into :class:`~._async.AsyncSandbox` (``start``,
``terminal``, ``processes``, ``process``); the same calls as the sync face
(``_process_sync``), awaited; requests and models come from :mod:`_processes`.
"""

from __future__ import annotations

import builtins
import time
from collections.abc import AsyncIterator, Mapping
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
    from ._async import AsyncSandbox


class AsyncSandboxProcesses:
    """The background-process calls of an :class:`AsyncSandbox`."""

    async def start(
        self,
        cmd: _requests.Command,
        timeout: float | None = None,  # noqa: ASYNC109 (the command's own timeout)
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        user: str | None = None,
        stdin: bool = False,
        pty: TerminalSize | None = None,
    ) -> AsyncProcess:
        """Start ``cmd`` in the background and return its handle at once.

        It runs until it exits, its ``timeout`` passes or the sandbox goes, whatever
        the caller does (no stream is tied to it). ``stdin=True`` keeps its stdin open
        for :meth:`Process.write`; ``pty=(rows, cols)`` runs it on a terminal instead
        (see :meth:`terminal`).
        """
        sandbox: AsyncSandbox = self  # type: ignore[assignment]
        start = sandbox._start(cmd, timeout, cwd, env, user, stdin=stdin)
        stub, access = await sandbox._executor()
        with translate_errors():
            msg = await stub.StartProcess(start_request(start, pty), metadata=access.metadata)
        return AsyncProcess(sandbox, msg.process_id)

    async def terminal(
        self,
        cmd: _requests.Command | None = None,
        rows: int = 24,
        cols: int = 80,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        user: str | None = None,
        timeout: float | None = None,  # noqa: ASYNC109 (the command's own timeout)
    ) -> AsyncProcess:
        """A command on a pseudo-terminal allocated in the sandbox (default: a login
        shell, bash if the image has it). It is its controlling terminal: ``tty``,
        job control and Ctrl-C (write ``b"\\x03"``) work; ``resize`` sends SIGWINCH.
        Output is one stream (``stdout``), raw bytes with the terminal's escapes."""
        return await self.start(
            list(DEFAULT_SHELL) if cmd is None else cmd,
            timeout,
            cwd,
            {"TERM": "xterm-256color", **(env or {})},
            user,
            pty=(rows, cols),
        )

    async def processes(self) -> builtins.list[ProcessInfo]:
        """The sandbox's background processes: running ones and recently finished ones."""
        sandbox: AsyncSandbox = self  # type: ignore[assignment]
        stub, access = await sandbox._executor()
        with translate_errors():
            msg = await stub.ListProcesses(
                executor_pb2.ListProcessesRequest(sandbox_id=sandbox.id), metadata=access.metadata
            )
        return [process_info(p) for p in msg.processes]

    async def process(self, process_id: str) -> AsyncProcess:
        """A handle on an existing process (from another client, or after a reconnect);
        raises :class:`ProcessError` if the sandbox has no such process."""
        handle = AsyncProcess(self, process_id)  # type: ignore[arg-type]
        await handle.info()
        return handle


class AsyncProcess(ProcessCore):
    """A background process (or terminal) of a sandbox; see :meth:`AsyncSandbox.start`."""

    def __init__(self, sandbox: AsyncSandbox, process_id: str) -> None:
        super().__init__(sandbox.id, process_id)
        self.sandbox = sandbox

    async def _call_wait(self, seconds: float) -> executor_pb2.WaitProcessResponse:
        stub, access = await self.sandbox._executor()
        with translate_errors():
            return await stub.WaitProcess(
                self._wait_request(seconds),
                metadata=access.metadata,
                timeout=seconds + WAIT_GRACE_SECONDS,
            )

    async def _send(self, request: executor_pb2.ProcessInputRequest) -> None:
        stub, access = await self.sandbox._executor()
        with translate_errors():
            await stub.ProcessInput(request, metadata=access.metadata)

    async def info(self) -> ProcessInfo:
        """Its state now (running, exited with its status, or lost)."""
        return process_info((await self._call_wait(0)).process)

    async def output(
        self, offset: int | None = None, from_now: bool = False
    ) -> AsyncIterator[ProcessEvent]:
        """Its output as it comes, from ``offset`` (default: the start) or from now,
        ending with its :class:`ExecStatus`. An :class:`OutputDropped` first says how
        much older output the buffer no longer holds. Stopping the iteration only
        stops reading: the process runs on. ``self.offset`` follows what was read."""
        stub, access = await self.sandbox._executor()
        call = stub.AttachProcess(self._attach_request(offset, from_now), metadata=access.metadata)
        try:
            with translate_errors():
                async for msg in call:
                    event = self._seen(msg)
                    if event is not None:
                        yield event
        finally:
            call.cancel()

    async def write(self, data: bytes | str) -> None:
        """Send bytes to its stdin (or terminal); a str is sent as UTF-8."""
        await self._send(self._stdin_request(data))

    async def close_stdin(self) -> None:
        """End its stdin (EOF). A terminal has no end of input: send ``b"\\x04"``."""
        await self._send(self._input(close_stdin=True))

    async def signal(self, signal: int) -> None:
        """Send ``signal`` to its process group."""
        await self._send(self._signal_request(signal))

    async def kill(self) -> None:
        """SIGKILL its process group."""
        await self.signal(9)

    async def resize(self, rows: int, cols: int) -> None:
        """Resize its terminal (the kernel sends it SIGWINCH)."""
        await self._send(self._resize_request(rows, cols))

    async def poll(self) -> ExecResult | None:
        """Its result if it has exited, else None (no wait)."""
        return wait_result(await self._call_wait(0))

    async def wait(self, timeout: float | None = None) -> ExecResult:  # noqa: ASYNC109
        """Wait until it exits and return its result (the output still buffered);
        :class:`DeadlineExceededError` (a ``TimeoutError``) after ``timeout`` seconds."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            left = WAIT_SLICE_SECONDS if deadline is None else deadline - time.monotonic()
            result = wait_result(await self._call_wait(max(0.0, min(left, WAIT_SLICE_SECONDS))))
            if result is not None:
                return result
            if deadline is not None and time.monotonic() >= deadline:
                raise DeadlineExceededError(
                    f"process {self.id} still running after {timeout} s", code="DEADLINE_EXCEEDED"
                )
