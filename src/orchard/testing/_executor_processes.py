"""The fake executor's background-process RPCs (a mixin of ``FakeExecutorService``).

Field checks and refusals follow ``services/executor/background_rpc.py``; the
processes themselves are in :mod:`_background`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from typing import TYPE_CHECKING

from orchard._proto.orchard.v1 import executor_pb2 as pb

from ._background import STDERR, STDOUT, FakeProcess, check_pty_size
from ._control import refusals, refusals_streaming
from ._rpc import CallContext
from ._status import invalid, precondition

if TYPE_CHECKING:
    from ._executor import FakeExecutorService

MAX_WAIT_SECONDS = 3600.0
_START_REASONS = {127: "EXECUTABLE_NOT_FOUND", 126: "EXECUTABLE_NOT_FOUND"}


class FakeProcessRpcs:
    """StartProcess, ListProcesses, AttachProcess, ProcessInput, WaitProcess."""

    def _process(self, sandbox_id: str, process_id: str, context: CallContext) -> FakeProcess:
        service: FakeExecutorService = self  # type: ignore[assignment]
        rec = service._sandbox(sandbox_id, context)
        return service.runtimes.of(rec.id).processes.get(sandbox_id, process_id)

    @refusals
    def StartProcess(self, request: pb.StartProcessRequest, context: CallContext) -> pb.ProcessInfo:
        service: FakeExecutorService = self  # type: ignore[assignment]
        start = request.start
        rec, _ = service._checked_start(start, context)
        size = check_pty_size(request.pty) if request.HasField("pty") else None
        call = service._call(rec, start, b"")
        process = FakeProcess(rec.id, call.argv)
        scripted = service.scripts.find(call)
        runtime = service.runtimes.of(rec.id)
        if scripted is not None:
            # A scripted command has no process: it is one that already finished.
            response = scripted.response(1 << 20)
            process.append(STDOUT, response.stdout)
            process.append(STDERR, response.stderr)
            process.finish(response.status)
        elif size is not None:
            command = service._command(rec, start, call)
            process.run_terminal(command.spec, size, runtime.groups)
        else:
            command = service._command(rec, start, call)
            command = type(command)(
                dataclasses.replace(command.spec, stdin=start.stdin, limit=1 << 62),
                runtime.groups,
            )
            process.run_pipes(command)
            if command.failure is not None:
                code, message = command.failure
                raise precondition(
                    f"{message.decode(errors='replace').strip()} (exit {code})",
                    _START_REASONS.get(code, "EXECUTABLE_NOT_FOUND"),
                )
        runtime.processes.add(process)
        return process.info()

    @refusals
    def ListProcesses(
        self, request: pb.ListProcessesRequest, context: CallContext
    ) -> pb.ListProcessesResponse:
        service: FakeExecutorService = self  # type: ignore[assignment]
        rec = service._sandbox(request.sandbox_id, context)
        found = service.runtimes.of(rec.id).processes.list()
        return pb.ListProcessesResponse(processes=[p.info() for p in found])

    @refusals_streaming
    def AttachProcess(
        self, request: pb.AttachProcessRequest, context: CallContext
    ) -> Iterator[pb.ProcessEvent]:
        process = self._process(request.sandbox_id, request.process_id, context)
        yield from process.events(request.offset, request.from_now)

    @refusals
    def ProcessInput(
        self, request: pb.ProcessInputRequest, context: CallContext
    ) -> pb.ProcessInputResponse:
        process = self._process(request.sandbox_id, request.process_id, context)
        kind = request.WhichOneof("kind")
        if kind == "stdin":
            process.write(request.stdin)
        elif kind == "close_stdin":
            process.close_stdin()
        elif kind == "signal":
            process.signal(request.signal)
        elif kind == "resize":
            process.resize(request.resize)
        else:
            raise invalid("ProcessInput needs one of stdin, close_stdin, signal, resize")
        return pb.ProcessInputResponse()

    @refusals
    def WaitProcess(
        self, request: pb.WaitProcessRequest, context: CallContext
    ) -> pb.WaitProcessResponse:
        from ._executor import check_timeout

        process = self._process(request.sandbox_id, request.process_id, context)
        check_timeout(request.timeout_seconds)
        process.wait(min(request.timeout_seconds, MAX_WAIT_SECONDS))
        response = pb.WaitProcessResponse(process=process.info())
        if process.status is not None:
            response.stdout = process.stream_bytes(STDOUT)
            if not process.pty:
                response.stderr = process.stream_bytes(STDERR)
        return response
