"""The ExecutorService methods of background processes and terminals.

A mixin of :class:`~.server.ExecutorServicer`, kept apart so the process RPCs
(start, list, attach, input, wait) read in one place; the work is in
:mod:`background`, the output buffer in :mod:`output_ring`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator, Callable
from typing import Any

import grpc

from orchard._proto.orchard.v1 import executor_pb2 as pb
from orchard.common.errors import infrastructure, invalid

from .background import BackgroundProcess, ProcessTable, check_pty_size
from .commands import OutputLimits, check_command_fields, check_timeout, prepare_exec
from .output_ring import STDERR, STDOUT, Chunk
from .sandboxes import Sandbox
from .shares import call_owner

Context = grpc.aio.ServicerContext[Any, Any]
# A WaitProcess answers by this long at most: a longer wait is several calls.
MAX_WAIT_SECONDS = 3600.0


class ProcessRpcs:
    """StartProcess, ListProcesses, AttachProcess, ProcessInput, WaitProcess."""

    processes: ProcessTable
    _limits: OutputLimits

    # The servicer's own lookup (token check, then the sandbox), which this mixin calls.
    _sandbox: Callable[[str, Context], Sandbox]

    def _process(self, sandbox_id: str, process_id: str, context: Context) -> BackgroundProcess:
        self._sandbox(sandbox_id, context)
        return self.processes.get(sandbox_id, process_id)

    async def StartProcess(
        self, request: pb.StartProcessRequest, context: Context
    ) -> pb.ProcessInfo:
        start = request.start
        sandbox = self._sandbox(start.sandbox_id, context)
        check_command_fields(start)
        pty = request.HasField("pty")
        if pty:
            size = check_pty_size(request.pty.rows, request.pty.cols)
        prepared = await prepare_exec(sandbox, start, self._limits, stdin=start.stdin and not pty)
        if pty:
            prepared = dataclasses.replace(
                prepared, request=dataclasses.replace(prepared.request, pty=size)
            )
        process = await self.processes.start(prepared, call_owner(sandbox.sandbox_id))
        return process.info()

    async def ListProcesses(
        self, request: pb.ListProcessesRequest, context: Context
    ) -> pb.ListProcessesResponse:
        self._sandbox(request.sandbox_id, context)
        found = self.processes.list(request.sandbox_id)
        return pb.ListProcessesResponse(processes=[p.info() for p in found])

    async def AttachProcess(
        self, request: pb.AttachProcessRequest, context: Context
    ) -> AsyncIterator[pb.ProcessEvent]:
        process = self._process(request.sandbox_id, request.process_id, context)
        ring = process.ring
        if request.offset > ring.end and not request.from_now:
            raise invalid(f"offset {request.offset} is past the output's end ({ring.end})")
        offset = ring.end if request.from_now else request.offset
        while True:
            changed = ring.next_change
            dropped, chunks = ring.read_from(offset)
            if dropped:
                offset += dropped
                yield pb.ProcessEvent(dropped=dropped, offset=offset)
            for chunk in chunks:
                offset = chunk.end
                yield _output_event(chunk)
            if process.done.is_set() and offset >= ring.end:
                if process.lost is not None:
                    raise infrastructure(process.lost, "SANDBOX_NOT_READY")
                yield pb.ProcessEvent(exit=process.status, offset=offset)
                return
            if not dropped and not chunks:
                await changed.wait()

    async def ProcessInput(
        self, request: pb.ProcessInputRequest, context: Context
    ) -> pb.ProcessInputResponse:
        process = self._process(request.sandbox_id, request.process_id, context)
        kind = request.WhichOneof("kind")
        if kind == "stdin":
            await process.write(request.stdin)
        elif kind == "close_stdin":
            process.close_stdin()
        elif kind == "signal":
            process.signal(request.signal)
        elif kind == "resize":
            process.resize(request.resize.rows, request.resize.cols)
        else:
            raise invalid("ProcessInput needs one of stdin, close_stdin, signal, resize")
        return pb.ProcessInputResponse()

    async def WaitProcess(
        self, request: pb.WaitProcessRequest, context: Context
    ) -> pb.WaitProcessResponse:
        process = self._process(request.sandbox_id, request.process_id, context)
        check_timeout(request.timeout_seconds)
        await process.wait(min(request.timeout_seconds, MAX_WAIT_SECONDS))
        response = pb.WaitProcessResponse(process=process.info())
        if process.status is not None:
            response.stdout = process.ring.stream_bytes(STDOUT)
            if not process.pty:
                response.stderr = process.ring.stream_bytes(STDERR)
        return response


def _output_event(chunk: Chunk) -> pb.ProcessEvent:
    if chunk.stream == STDOUT:
        return pb.ProcessEvent(stdout=chunk.data, offset=chunk.end)
    return pb.ProcessEvent(stderr=chunk.data, offset=chunk.end)
