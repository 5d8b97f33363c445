"""The node executor's gRPC service: ExecutorService on grpc.aio.

Each method checks the call (sandbox id, token, sandbox exists), validates
its fields, and hands the work to the exec engine (:mod:`commands`), the
session table (:mod:`sessions`) or the file service. Errors travel as
:class:`ServiceError` and become statuses at the one service edge
(:mod:`orchard.common.service_edge`, installed by the :class:`ServiceRunner`).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import grpc
import structlog

from orchard._proto.orchard.v1 import executor_pb2 as pb
from orchard._proto.orchard.v1 import executor_pb2_grpc as pb_grpc
from orchard.common.errors import invalid
from orchard.common.observability import ServerObservability
from orchard.common.service_runner import ServiceRunner, wait_for_stop_signal
from orchard.common.tls import server_credentials
from orchard.common.tokens import (
    KEY_DROP_VERSION,
    Revocations,
    TokenError,
    TokenVerifier,
    decode_sandbox_keys,
)
from orchard.common.undecodable import UndecodableRequests

from .auth import CallAuthorizer
from .background import ProcessLimits, ProcessTable
from .background_rpc import ProcessRpcs
from .commands import (
    ExecStream,
    OutputLimits,
    check_command_fields,
    check_cwd,
    check_env,
    check_timeout,
    prepare_exec,
    run_exec,
)
from .exec_quota import ExecSlots
from .files import SandboxFiles
from .gone import refine_failures, remember
from .kill_all import check_signal, kill_all_processes
from .output_budget import STREAMED_WEIGHT, OutputBudget, OutputPace
from .port_dial import LocalDialer, NamespaceDialer, PortDialer
from .ports import PortConnections
from .sandboxes import Sandbox, SandboxDirectory, SandboxLocator, SingleSandbox
from .sessions import SessionTable, check_session_command
from .settings import ExecutorSettings
from .shares import call_owner
from .stream_bounds import SmallMessageLimits, StreamPace, next_or_idle

log = structlog.get_logger("orchard.executor")

Context = grpc.aio.ServicerContext[Any, Any]


@refine_failures(lambda servicer: servicer._sandboxes)
class ExecutorServicer(ProcessRpcs, pb_grpc.ExecutorServiceServicer):
    """ExecutorService: exec, sessions, files (through the file service), ports (ports.py),
    background processes and terminals (background_rpc.py)."""

    def __init__(self, settings: ExecutorSettings, signer: TokenVerifier) -> None:
        self._authorizer = CallAuthorizer(signer)
        self._sandboxes: SandboxLocator = (
            SingleSandbox(settings.in_sandbox_run_dir)
            if settings.in_sandbox_run_dir is not None
            else SandboxDirectory(settings.layout)
        )
        self._limits = OutputLimits(settings.max_output_bytes, settings.output_bytes_ceiling)
        pace = OutputPace(
            settings.output_bytes_per_second_per_tenant, settings.output_pace_burst_bytes
        )
        self._output = OutputBudget(settings.output_shares, pace)
        self.sessions = SessionTable(settings.session_shares)
        self._exec_slots = ExecSlots()
        self._injected = settings.in_sandbox_run_dir is not None
        self._idle_seconds = settings.stream_idle_seconds
        self._small_limits = SmallMessageLimits(
            settings.small_messages_per_second, settings.max_small_messages_per_stream
        )
        dialer: PortDialer = LocalDialer() if self._injected else NamespaceDialer()
        self.ports = PortConnections(dialer, settings.port_shares)
        self.processes = ProcessTable(
            ProcessLimits(
                settings.process_shares,
                settings.process_buffer_bytes,
                settings.finished_processes_kept,
                settings.finished_process_seconds,
            ),
            self._output,
        )

    def _sandbox(self, sandbox_id: str, context: Context) -> Sandbox:
        self._authorizer.check(sandbox_id, context.invocation_metadata())
        return remember(self._sandboxes.get(sandbox_id))

    # ------------------------------------------------------------------ exec

    async def Run(self, request: pb.RunRequest, context: Context) -> pb.RunResponse:
        start = request.start
        sandbox = self._sandbox(start.sandbox_id, context)
        check_command_fields(start)
        prepared = await prepare_exec(sandbox, start, self._limits, stdin=bool(request.stdin))
        with self._exec_slots.hold(), self._output.charge(call_owner(sandbox.sandbox_id)) as charge:
            return await run_exec(prepared, request.stdin, charge)

    async def Exec(
        self, request_iterator: AsyncIterator[pb.ExecRequest], context: Context
    ) -> AsyncIterator[pb.ExecEvent]:
        self._authorizer.check_before_first_message(context.invocation_metadata())
        first = await next_or_idle(aiter(request_iterator), self._idle_seconds, "Exec")
        if first is None or first.WhichOneof("kind") != "start":
            raise invalid("the first ExecRequest must be `start`")
        start = first.start
        sandbox = self._sandbox(start.sandbox_id, context)
        check_command_fields(start)
        prepared = await prepare_exec(sandbox, start, self._limits, stdin=start.stdin)
        pump: asyncio.Task[None] | None = None
        owner = call_owner(sandbox.sandbox_id)
        with self._exec_slots.hold(), self._output.charge(owner, STREAMED_WEIGHT) as charge:
            stream = ExecStream(prepared, charge)
            try:
                await stream.start()
                pace = StreamPace(self._small_limits, "Exec", capped=False)
                pump = asyncio.create_task(_pump_requests(request_iterator, stream, pace))
                while (event := await stream.next_event()) is not None:
                    yield event
            finally:
                if pump is not None:
                    pump.cancel()
                stream.close()

    # -------------------------------------------------------------- sessions

    async def CreateSession(self, request: pb.CreateSessionRequest, context: Context) -> pb.Session:
        sandbox = self._sandbox(request.sandbox_id, context)
        check_env(request.env)
        check_cwd(request.cwd)
        start = pb.ExecStart(
            sandbox_id=request.sandbox_id,
            argv=["bash"],
            cwd=request.cwd,
            env=dict(request.env),
            user=request.user,
        )
        prepared = await prepare_exec(sandbox, start, self._limits, stdin=False)
        session = await self.sessions.create(prepared, call_owner(sandbox.sandbox_id))
        log.info("session created", sandbox_id=request.sandbox_id, session_id=session.session_id)
        return pb.Session(sandbox_id=request.sandbox_id, session_id=session.session_id)

    async def SessionRun(self, request: pb.SessionRunRequest, context: Context) -> pb.RunResponse:
        sandbox = self._sandbox(request.sandbox_id, context)
        check_session_command(request.command)
        check_timeout(request.timeout_seconds)
        limit = self._limits.for_request(request.max_output_bytes)
        session = self.sessions.get(request.sandbox_id, request.session_id)
        with self._exec_slots.hold(), self._output.charge(call_owner(sandbox.sandbox_id)) as charge:
            return await session.run(request.command, request.timeout_seconds, limit, charge)

    async def InterruptSession(
        self, request: pb.SessionRef, context: Context
    ) -> pb.InterruptSessionResponse:
        self._sandbox(request.sandbox_id, context)
        self.sessions.get(request.sandbox_id, request.session_id).interrupt()
        return pb.InterruptSessionResponse()

    async def CloseSession(
        self, request: pb.SessionRef, context: Context
    ) -> pb.CloseSessionResponse:
        self._sandbox(request.sandbox_id, context)
        self.sessions.close(request.sandbox_id, request.session_id)
        log.info("session closed", sandbox_id=request.sandbox_id, session_id=request.session_id)
        return pb.CloseSessionResponse()

    async def KillAll(self, request: pb.KillAllRequest, context: Context) -> pb.KillAllResponse:
        sandbox = self._sandbox(request.sandbox_id, context)
        signal = check_signal(request.signal)
        killed = await kill_all_processes(sandbox, signal, keep_self=self._injected)
        log.info("kill-all", sandbox_id=request.sandbox_id, signal=signal, killed=killed)
        return pb.KillAllResponse(killed=killed)

    async def Revoke(self, request: pb.RevokeRequest, context: Context) -> pb.RevokeResponse:
        if request.notice.startswith(KEY_DROP_VERSION + "."):
            kid, held = self._authorizer.drop_key(request.sandbox_id, request.notice)
            log.info("token key dropped", sandbox_id=request.sandbox_id, kid=kid, held=held)
            return pb.RevokeResponse()
        tenant, before = self._authorizer.revoke(request.sandbox_id, request.notice)
        log.info("tokens revoked", sandbox_id=request.sandbox_id, tenant=tenant, before=before)
        return pb.RevokeResponse()

    # ----------------------------------------------------------------- files

    async def _data_chunks(
        self,
        requests: AsyncIterator[pb.WriteFileRequest | pb.UploadRequest],
        what: str,
        *,
        end_required: bool = False,
    ) -> AsyncIterator[bytes]:
        """The ``data`` of every message after the header, idle- and pace-bounded.

        ``end_required`` (WriteFile): the data counts only once an ``end`` message gives its
        size. grpc.aio hands a handler a client's cancel as the stream's end (``read()`` is
        EOF once the client is gone), so without it a client that died or gave up mid-file
        left a truncated file committed under its name. Raising here makes the writer drop
        its temporary file."""
        pace = StreamPace(self._small_limits, what[:-7])
        sent = 0
        while (request := await next_or_idle(requests, self._idle_seconds, what[:-7])) is not None:
            kind = request.WhichOneof("kind")
            if kind == "data":
                await pace.account(len(request.data))
                sent += len(request.data)
                yield request.data
            elif kind == "end" and end_required:
                size = request.end.size  # type: ignore[union-attr]
                if size != sent:
                    raise invalid(
                        f"the {what} `end` says {size} bytes but {sent} were sent: "
                        "nothing was written"
                    )
                if await next_or_idle(requests, self._idle_seconds, what[:-7]) is not None:
                    raise invalid(f"a {what} came after `end`: nothing was written")
                return
            else:
                later = "`data`, then `end`" if end_required else "`data`"
                raise invalid(f"after the `header`, a {what} carries {later} (got `{kind}`)")
        if end_required:
            raise invalid(
                f"the {what} stream stopped before its `end` message (a cancelled or dropped "
                "client): nothing was written"
            )

    async def ReadFile(
        self, request: pb.ReadFileRequest, context: Context
    ) -> AsyncIterator[pb.FileChunk]:
        sandbox = self._sandbox(request.sandbox_id, context)
        async for chunk in SandboxFiles(sandbox.rootfs).read_file(request.path):
            yield chunk

    async def WriteFile(
        self, request_iterator: AsyncIterator[pb.WriteFileRequest], context: Context
    ) -> pb.WriteFileResponse:
        requests = aiter(request_iterator)
        self._authorizer.check_before_first_message(context.invocation_metadata())
        first = await next_or_idle(requests, self._idle_seconds, "WriteFile")
        if first is None or first.WhichOneof("kind") != "header":
            raise invalid("the first WriteFileRequest must be `header`")
        header = first.header
        sandbox = self._sandbox(header.sandbox_id, context)
        files = SandboxFiles(sandbox.rootfs, owner=sandbox.meta.root_uid)
        size = await files.write_file(
            header.path,
            header.mode,
            header.make_parents,
            self._data_chunks(requests, "WriteFileRequest", end_required=True),
            owner=header.owner,
        )
        return pb.WriteFileResponse(size=size)

    async def Upload(
        self, request_iterator: AsyncIterator[pb.UploadRequest], context: Context
    ) -> pb.UploadResponse:
        requests = aiter(request_iterator)
        self._authorizer.check_before_first_message(context.invocation_metadata())
        first = await next_or_idle(requests, self._idle_seconds, "Upload")
        if first is None or first.WhichOneof("kind") != "header":
            raise invalid("the first UploadRequest must be `header`")
        header = first.header
        sandbox = self._sandbox(header.sandbox_id, context)
        files = SandboxFiles(sandbox.rootfs, owner=sandbox.meta.root_uid)
        count, size = await files.upload(
            header.path, self._data_chunks(requests, "UploadRequest"), owner=header.owner
        )
        return pb.UploadResponse(files=count, bytes=size)

    async def Download(
        self, request: pb.DownloadRequest, context: Context
    ) -> AsyncIterator[pb.TarChunk]:
        sandbox = self._sandbox(request.sandbox_id, context)
        async for data in SandboxFiles(sandbox.rootfs).download(request.path):
            yield pb.TarChunk(data=data)

    # ----------------------------------------------------------------- ports

    async def ConnectPort(
        self, request_iterator: AsyncIterator[pb.PortRequest], context: Context
    ) -> AsyncIterator[pb.PortEvent]:
        requests = aiter(request_iterator)
        self._authorizer.check_before_first_message(context.invocation_metadata())
        first = await next_or_idle(requests, self._idle_seconds, "ConnectPort")
        if first is None or first.WhichOneof("kind") != "open":
            raise invalid("the first PortRequest must be `open`")
        sandbox = self._sandbox(first.open.sandbox_id, context)
        pace = StreamPace(self._small_limits, "ConnectPort", capped=False)
        owner = call_owner(sandbox.sandbox_id)
        async for event in self.ports.relay(sandbox, owner, first.open, requests, pace):
            yield event

    def _files(self, sandbox_id: str, context: Context) -> SandboxFiles:
        sandbox = self._sandbox(sandbox_id, context)
        return SandboxFiles(sandbox.rootfs, owner=sandbox.meta.root_uid)

    async def ListDir(self, request: pb.ListDirRequest, context: Context) -> pb.ListDirResponse:
        files = self._files(request.sandbox_id, context)
        entries, truncated = await files.list_dir(request.path, request.depth, request.max_entries)
        return pb.ListDirResponse(entries=entries, truncated=truncated)

    async def Stat(self, request: pb.StatRequest, context: Context) -> pb.FileStat:
        files = self._files(request.sandbox_id, context)
        return await files.stat(request.path, follow=not request.no_follow)

    async def Remove(self, request: pb.RemoveRequest, context: Context) -> pb.RemoveResponse:
        files = self._files(request.sandbox_id, context)
        return pb.RemoveResponse(removed=await files.remove(request.path, request.recursive))

    async def Rename(self, request: pb.RenameRequest, context: Context) -> pb.RenameResponse:
        files = self._files(request.sandbox_id, context)
        await files.rename(request.source, request.destination)
        return pb.RenameResponse()

    async def MakeDir(self, request: pb.MakeDirRequest, context: Context) -> pb.MakeDirResponse:
        files = self._files(request.sandbox_id, context)
        created = await files.make_dir(request.path, request.parents, request.mode, request.owner)
        return pb.MakeDirResponse(created=created)


async def _pump_requests(
    requests: AsyncIterator[pb.ExecRequest], stream: ExecStream, pace: StreamPace
) -> None:
    """Feed stdin chunks, close_stdin and signals from the client to the command."""
    try:
        async for request in requests:
            kind = request.WhichOneof("kind")
            await pace.account(len(request.stdin) if kind == "stdin" else 0)
            if kind == "stdin":
                await stream.write_stdin(request.stdin)
            elif kind == "close_stdin":
                stream.close_stdin()
            elif kind == "signal":
                stream.signal(request.signal)
            else:
                raise invalid("`start` may only be the first ExecRequest")
        # The client half-closed: no more stdin either.
        stream.close_stdin()
    except asyncio.CancelledError:
        raise
    except Exception as exc:  # a bad message or a broken stream ends the exec
        stream.fail(exc)


def token_verifier(settings: ExecutorSettings) -> TokenVerifier:
    """How this executor checks tokens. Node mode: the node's keyring and the tenants'
    revocations. Injected mode (the local injected runtime, a Kubernetes pod): what
    ``run/token.key`` held, which is this sandbox's own keys (JSON from
    ``tokens.encode_sandbox_keys``) and nothing else; revocations reach it as notices
    (``Revoke``). A node key handed to an injected executor is refused: it would let
    whoever reads it out of the sandbox mint tokens for every other sandbox."""
    if settings.token_key is None:
        layout = settings.layout
        return TokenVerifier(
            keyring=layout.keyring_file(), revocations=Revocations(layout.revocations)
        )
    if not settings.token_key.lstrip().startswith(b"{"):
        raise TokenError(
            "run/token.key is not this sandbox's own keys (tokens.encode_sandbox_keys): an "
            "injected executor never takes a node key"
        )
    sandbox_id, keys = decode_sandbox_keys(settings.token_key)
    return TokenVerifier.for_sandbox(sandbox_id, keys)


def server_options(settings: ExecutorSettings) -> list[tuple[str, Any]]:
    return [
        ("grpc.max_receive_message_length", settings.max_receive_message_bytes),
        ("grpc.max_send_message_length", -1),
        ("grpc.so_reuseport", 0),
    ]


async def start_server(settings: ExecutorSettings) -> tuple[ServiceRunner, ExecutorServicer]:
    """Start serving; returns the running server (its ``address``) and the servicer."""
    servicer = ExecutorServicer(settings, token_verifier(settings))
    runner = ServiceRunner(
        "executor",
        settings.listen,
        options=server_options(settings),
        interceptors=[UndecodableRequests(), ServerObservability("executor")],
        server_credentials=server_credentials(settings.tls, settings.listen),
        address_file=settings.address_file,
    )
    runner.add_servicer(
        pb_grpc.add_ExecutorServiceServicer_to_server,  # type: ignore[arg-type]
        servicer,
        "orchard.v1.ExecutorService",
    )
    address = await runner.start()
    await runner.serving()
    log.info(
        "executor listening", address=address, home=str(settings.home), tls=settings.tls is not None
    )
    return runner, servicer


async def serve(settings: ExecutorSettings) -> None:
    """Serve until SIGTERM or SIGINT, then shut down gracefully."""
    runner, servicer = await start_server(settings)
    print(runner.address, flush=True)
    try:
        await wait_for_stop_signal()
    finally:
        servicer.sessions.close_all()
        servicer.processes.close_all()
        await runner.stop(settings.shutdown_grace_seconds)
        log.info("executor stopped", address=runner.address)
