"""The fake data plane: ExecutorService over a sandbox's host directory.

Every call names its sandbox and carries that sandbox's token, checked in the
real executor's order: the id's form (INVALID_ARGUMENT), the token
(UNAUTHENTICATED / TOKEN_INVALID), then the sandbox (NOT_FOUND /
SANDBOX_NOT_FOUND). Field checks follow ``services/executor/commands.py``.
"""

from __future__ import annotations

import math
import posixpath
import queue
import resource
import secrets
import threading
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import grpc

from orchard._proto.orchard.v1 import executor_pb2 as pb
from orchard._proto.orchard.v1 import executor_pb2_grpc as pb_grpc
from orchard.common.exec_limits import exec_size_error

from . import _file_ops, _files, _ports
from ._control import refusals, refusals_streaming
from ._executor_processes import FakeProcessRpcs
from ._process import Command, CommandSpec
from ._rpc import CallContext
from ._sandboxes import SandboxRuntimes
from ._scripts import ExecCall, Scripts
from ._sessions import ScriptedSession, ShellSession
from ._status import Refusal, invalid, not_found, unauthenticated
from ._world import MODEL_ENDPOINT_ENV, SANDBOX_ID_RE, SandboxRecord, World

DEFAULT_OUTPUT_BYTES = 16 << 20
OUTPUT_CEILING_BYTES = 256 << 20
MAX_TIMEOUT_SECONDS = 30 * 24 * 3600.0
MAX_SIGNAL = 64
HOST_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def check_timeout(seconds: float) -> None:
    if not math.isfinite(seconds) or seconds < 0:
        raise invalid("timeout_seconds must be a finite number >= 0")
    if seconds > MAX_TIMEOUT_SECONDS:
        raise invalid(f"timeout_seconds must be at most {MAX_TIMEOUT_SECONDS:.0f}")


def check_env(env: Mapping[str, str]) -> None:
    for name, value in env.items():
        if not name or "=" in name or "\0" in name or "\0" in value:
            raise invalid(
                f"env name {name[:60]!r} is invalid (empty, '=' or NUL) or its value has NUL"
            )


def check_cwd(cwd: str) -> None:
    if len(cwd) > 4096 or "\0" in cwd:
        raise invalid("cwd must be a path of at most 4096 characters without NUL")


def check_command_fields(start: pb.ExecStart) -> None:
    if start.argv and start.shell:
        raise invalid("set either argv or shell, not both")
    if not start.argv and not start.shell:
        raise invalid("argv or shell is required")
    if start.argv and not start.argv[0]:
        raise invalid("argv[0] must not be empty")
    if any("\0" in a for a in start.argv) or "\0" in start.shell:
        raise invalid("argv and shell must not contain NUL characters")
    check_env(start.env)
    # The kernel's rule at its 6 MiB ceiling, as the real executor checks it first.
    argv = list(start.argv) if start.argv else ["/bin/sh", "-c", start.shell]
    problem = exec_size_error(argv, [f"{k}={v}" for k, v in start.env.items()], None)
    if problem is not None:
        raise invalid(problem)
    check_cwd(start.cwd)
    check_timeout(start.timeout_seconds)


def cwd_parts(cwd: str) -> tuple[str, ...]:
    """The working directory as the real executor takes it: joined to "/" and
    normalised (a ``..`` above "/" stays at "/", as in the sandbox itself)."""
    return _files.clean_parts(posixpath.normpath(posixpath.join("/", cwd or "/")))


def output_limit(requested: int) -> int:
    if requested < 0:
        raise invalid("max_output_bytes must not be negative")
    return DEFAULT_OUTPUT_BYTES if requested == 0 else min(requested, OUTPUT_CEILING_BYTES)


def lookup_user(root: Path, user: str) -> tuple[str, str]:
    """(name, home) of ``user`` in the sandbox's own /etc/passwd; root always exists."""
    name, has_group, group = user.partition(":")
    if not name or (has_group and not group):
        raise invalid(f"user {user!r} is not 'name', 'uid' or 'user:group'")
    try:
        text = (root / "etc" / "passwd").read_text(errors="replace")
    except OSError:
        text = ""
    for line in text.splitlines():
        fields = line.split(":")
        if len(fields) >= 7 and (fields[0] == name or fields[2] == name):
            return fields[0], fields[5] or "/"
    if name in ("root", "0"):
        return "root", "/root"
    raise not_found(f"user {name!r} does not exist in the sandbox", "USER_NOT_FOUND")


class FakeExecutorService(FakeProcessRpcs):
    def __init__(
        self, world: World, runtimes: SandboxRuntimes, scripts: Scripts, run_commands: bool
    ) -> None:
        self.world = world
        self.runtimes = runtimes
        self.scripts = scripts
        self.run_commands = run_commands

    @staticmethod
    def _sandbox_id_checked(sandbox_id: str) -> None:
        if not SANDBOX_ID_RE.fullmatch(sandbox_id):
            raise invalid(f"sandbox_id {sandbox_id[:80]!r} is not a valid sandbox id")

    def _sandbox(self, sandbox_id: str, context: CallContext) -> SandboxRecord:
        self._sandbox_id_checked(sandbox_id)
        self.world.check_token(sandbox_id, context.invocation_metadata())
        with self.world.lock:
            rec = self.world.sandboxes.get(sandbox_id)
        if rec is None or not rec.usable:
            raise not_found(f"sandbox {sandbox_id!r} not found", "SANDBOX_NOT_FOUND")
        return rec

    # ---- commands ----------------------------------------------------------------

    def _environment(self, rec: SandboxRecord, user: str, env: Mapping[str, str]) -> dict[str, str]:
        """Host PATH, then the sandbox's env, the user's HOME/USER, then the request's env."""
        result = {"PATH": HOST_PATH, "HOME": str(rec.root), "ORCHARD_SANDBOX_ID": rec.id}
        result.update(rec.env)
        if rec.model_endpoint:
            result[MODEL_ENDPOINT_ENV] = rec.model_endpoint
        if user:
            name, home = lookup_user(rec.root, user)
            result["USER"] = result["LOGNAME"] = name
            result["HOME"] = str(_files.resolve(rec.root, cwd_parts(home)))
        result.update(env)
        return result

    def _call(self, rec: SandboxRecord, start: pb.ExecStart, stdin: bytes) -> ExecCall:
        shell = start.shell or None
        argv = tuple(start.argv) if start.argv else ("/bin/sh", "-c", start.shell)
        return ExecCall(
            sandbox_id=rec.id,
            argv=argv,
            shell=shell,
            cwd=_files.display(cwd_parts(start.cwd)),
            env=dict(start.env),
            user=start.user,
            stdin=stdin,
            timeout=start.timeout_seconds,
        )

    def _command(self, rec: SandboxRecord, start: pb.ExecStart, call: ExecCall) -> Command:
        if not self.run_commands:
            raise _unscripted(call.command)
        env = self._environment(rec, start.user, start.env)
        # The host's stack limit: the fake's commands are host processes.
        soft = resource.getrlimit(resource.RLIMIT_STACK)[0]
        problem = exec_size_error(
            call.argv,
            [f"{k}={v}" for k, v in env.items()],
            None if soft == resource.RLIM_INFINITY else soft,
        )
        if problem is not None:
            raise invalid(problem)
        cwd = cwd_parts(start.cwd)
        spec = CommandSpec(
            argv=call.argv,
            env=env,
            cwd=_files.resolve(rec.root, cwd),
            shown_cwd=_files.display(cwd),
            timeout=start.timeout_seconds,
            limit=output_limit(start.max_output_bytes),
            stdin=start.stdin if start.stdin else bool(call.stdin),
        )
        return Command(spec, self.runtimes.of(rec.id).groups)

    def _checked_start(
        self, start: pb.ExecStart, context: CallContext
    ) -> tuple[SandboxRecord, int]:
        """The sandbox (id, token, existence) and the output cap, every field checked."""
        rec = self._sandbox(start.sandbox_id, context)
        check_command_fields(start)
        limit = output_limit(start.max_output_bytes)
        if start.user:
            lookup_user(rec.root, start.user)
        return rec, limit

    @refusals
    def Run(self, request: pb.RunRequest, context: CallContext) -> pb.RunResponse:
        start = request.start
        rec, limit = self._checked_start(start, context)
        call = self._call(rec, start, request.stdin)
        scripted = self.scripts.find(call)
        if scripted is not None:
            return scripted.response(limit)
        command = self._command(rec, start, call)
        context.on_abandon(command.kill)
        return command.run(request.stdin)

    @refusals_streaming
    def Exec(
        self, request_iterator: Iterator[pb.ExecRequest], context: CallContext
    ) -> Iterator[pb.ExecEvent]:
        first = next(request_iterator, None)
        if first is None or first.WhichOneof("kind") != "start":
            raise invalid("the first ExecRequest must be `start`")
        start = first.start
        rec, limit = self._checked_start(start, context)
        probe = self._call(rec, start, b"")
        if self.scripts.matches(probe) or not self.run_commands:
            # A scripted command gets its whole stdin first (it has no process to stream to).
            stdin = b""
            if start.stdin:
                stdin = b"".join(
                    r.stdin for r in request_iterator if r.WhichOneof("kind") == "stdin"
                )
            call = self._call(rec, start, stdin)
            scripted = self.scripts.find(call)
            if scripted is None:
                raise _unscripted(call.command)
            yield from scripted.events(limit)
            return
        command = self._command(rec, start, probe)
        command.start()
        context.on_abandon(command.kill)
        errors: queue.Queue[Refusal] = queue.Queue()
        pump = threading.Thread(
            target=_pump_requests, args=(request_iterator, command, errors), daemon=True
        )
        pump.start()
        if not start.stdin:
            command.close_stdin()
        for event in command.events():
            if not errors.empty():
                command.kill()
                raise errors.get()
            yield event

    # ---- sessions ------------------------------------------------------------------

    @refusals
    def CreateSession(self, request: pb.CreateSessionRequest, context: CallContext) -> pb.Session:
        rec = self._sandbox(request.sandbox_id, context)
        check_env(request.env)
        check_cwd(request.cwd)
        session_id = f"s-{secrets.token_hex(8)}"
        session: ShellSession | ScriptedSession
        if self.run_commands:
            env = self._environment(rec, request.user, request.env)
            cwd = _files.resolve(rec.root, cwd_parts(request.cwd))
            if not cwd.is_dir():
                raise Refusal(
                    grpc.StatusCode.FAILED_PRECONDITION,
                    "SESSION_DEAD",
                    f"orchard: cannot change directory to {request.cwd}: No such file or directory",
                )
            session = ShellSession(session_id, cwd, env, self.runtimes.of(rec.id).groups)
        else:
            if request.user:
                lookup_user(rec.root, request.user)
            session = ScriptedSession(session_id)
        self.runtimes.add_session(rec.id, session)
        return pb.Session(sandbox_id=rec.id, session_id=session_id)

    @refusals
    def SessionRun(self, request: pb.SessionRunRequest, context: CallContext) -> pb.RunResponse:
        rec = self._sandbox(request.sandbox_id, context)
        if not request.command:
            raise invalid("command is required")
        if "\0" in request.command:
            raise invalid("command must not contain NUL characters")
        check_timeout(request.timeout_seconds)
        limit = output_limit(request.max_output_bytes)
        session = self.runtimes.session(rec.id, request.session_id)
        call = ExecCall(
            sandbox_id=rec.id,
            argv=("bash", "-c", request.command),
            shell=request.command,
            cwd="",
            env={},
            user="",
            stdin=b"",
            timeout=request.timeout_seconds,
            session_id=request.session_id,
        )
        scripted = self.scripts.find(call)
        if scripted is not None:
            return scripted.response(limit)
        context.on_abandon(lambda: session.interrupt() if session.busy else None)
        return session.run(request.command, request.timeout_seconds, limit)

    @refusals
    def InterruptSession(
        self, request: pb.SessionRef, context: CallContext
    ) -> pb.InterruptSessionResponse:
        rec = self._sandbox(request.sandbox_id, context)
        self.runtimes.session(rec.id, request.session_id).interrupt()
        return pb.InterruptSessionResponse()

    @refusals
    def CloseSession(self, request: pb.SessionRef, context: CallContext) -> pb.CloseSessionResponse:
        rec = self._sandbox(request.sandbox_id, context)
        self.runtimes.close_session(rec.id, request.session_id)
        return pb.CloseSessionResponse()

    @refusals
    def KillAll(self, request: pb.KillAllRequest, context: CallContext) -> pb.KillAllResponse:
        rec = self._sandbox(request.sandbox_id, context)
        signal = request.signal or 9
        if not 1 <= signal <= MAX_SIGNAL:
            raise invalid(
                f"signal must be 1..{MAX_SIGNAL} (or 0 for SIGKILL), got {request.signal}"
            )
        killed = self.runtimes.of(rec.id).groups.signal_all(signal)
        return pb.KillAllResponse(killed=killed)

    @refusals
    def Revoke(self, request: pb.RevokeRequest, context: CallContext) -> pb.RevokeResponse:
        """The scheduler's call to its nodes, with a notice signed by a sandbox's token key.

        The fake's tokens are random ids with no signing key behind them, so no notice
        can be verified: every one is refused, as the real executor refuses a notice it
        cannot verify (the SDK never makes this call)."""
        self._sandbox_id_checked(request.sandbox_id)
        raise unauthenticated(
            "revocation notice refused: the fake signs no tokens, so it verifies no notice",
            "REVOCATION_INVALID",
        )

    # ---- files -------------------------------------------------------------------------

    @refusals_streaming
    def ReadFile(self, request: pb.ReadFileRequest, context: CallContext) -> Iterator[pb.FileChunk]:
        rec = self._sandbox(request.sandbox_id, context)
        yield from _files.read_file(rec.root, request.path)

    @refusals
    def WriteFile(
        self, request_iterator: Iterator[pb.WriteFileRequest], context: CallContext
    ) -> pb.WriteFileResponse:
        header, data = _header_and_data(request_iterator, "WriteFileRequest")
        rec = self._sandbox(header.sandbox_id, context)
        _check_owner(rec.root, header.owner)
        size = _files.write_file(rec.root, header.path, header.mode, header.make_parents, data)
        return pb.WriteFileResponse(size=size)

    @refusals
    def Upload(
        self, request_iterator: Iterator[pb.UploadRequest], context: CallContext
    ) -> pb.UploadResponse:
        header, data = _header_and_data(request_iterator, "UploadRequest")
        rec = self._sandbox(header.sandbox_id, context)
        _check_owner(rec.root, header.owner)
        files, size = _files.upload(rec.root, header.path, data)
        return pb.UploadResponse(files=files, bytes=size)

    @refusals_streaming
    def Download(self, request: pb.DownloadRequest, context: CallContext) -> Iterator[pb.TarChunk]:
        rec = self._sandbox(request.sandbox_id, context)
        for data in _files.download(rec.root, request.path):
            yield pb.TarChunk(data=data)

    # ---- ports ---------------------------------------------------------------------------

    @refusals_streaming
    def ConnectPort(
        self, request_iterator: Iterator[pb.PortRequest], context: CallContext
    ) -> Iterator[pb.PortEvent]:
        first = next(request_iterator, None)
        if first is None or first.WhichOneof("kind") != "open":
            raise invalid("the first PortRequest must be `open`")
        rec = self._sandbox(first.open.sandbox_id, context)
        _ports.check_open(first.open)
        with self.world.lock:
            target = self.world.ports.get((rec.id, first.open.port))
        yield from _ports.relay(target, first.open.port, request_iterator)

    @refusals
    def ListDir(self, request: pb.ListDirRequest, context: CallContext) -> pb.ListDirResponse:
        rec = self._sandbox(request.sandbox_id, context)
        return _file_ops.list_dir(rec.root, request.path, request.depth, request.max_entries)

    @refusals
    def Stat(self, request: pb.StatRequest, context: CallContext) -> pb.FileStat:
        rec = self._sandbox(request.sandbox_id, context)
        return _file_ops.stat_entry(rec.root, request.path, follow=not request.no_follow)

    @refusals
    def Remove(self, request: pb.RemoveRequest, context: CallContext) -> pb.RemoveResponse:
        rec = self._sandbox(request.sandbox_id, context)
        return pb.RemoveResponse(
            removed=_file_ops.remove(rec.root, request.path, request.recursive)
        )

    @refusals
    def Rename(self, request: pb.RenameRequest, context: CallContext) -> pb.RenameResponse:
        rec = self._sandbox(request.sandbox_id, context)
        _file_ops.rename(rec.root, request.source, request.destination)
        return pb.RenameResponse()

    @refusals
    def MakeDir(self, request: pb.MakeDirRequest, context: CallContext) -> pb.MakeDirResponse:
        rec = self._sandbox(request.sandbox_id, context)
        _check_owner(rec.root, request.owner)
        created = _file_ops.make_dir(rec.root, request.path, request.parents, request.mode)
        return pb.MakeDirResponse(created=created)


def _check_owner(root: Path, owner: str) -> None:
    """Refuse an owner the sandbox does not know (applying it needs root: see _file_ops)."""
    if owner.strip():
        lookup_user(root, owner)


def _header_and_data(requests: Iterator[Any], what: str) -> tuple[Any, Iterator[bytes]]:
    """The first message's ``header``, and the ``data`` of every later one."""
    first = next(requests, None)
    if first is None or first.WhichOneof("kind") != "header":
        raise invalid(f"the first {what} must be `header`")
    return first.header, _data_chunks(requests, what)


def _data_chunks(requests: Iterator[Any], what: str) -> Iterator[bytes]:
    """``data`` after the header; a WriteFile stream counts only once its ``end`` gives the
    size (as the real executor: a stream cut short writes nothing)."""
    end_required = what == "WriteFileRequest"
    sent = 0
    for request in requests:
        kind = request.WhichOneof("kind")
        if kind == "data":
            sent += len(request.data)
            yield request.data
        elif kind == "end" and end_required:
            if request.end.size != sent:
                raise invalid(
                    f"the {what} `end` says {request.end.size} bytes but {sent} were sent: "
                    "nothing was written"
                )
            if next(requests, None) is not None:
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


def _pump_requests(
    requests: Iterator[pb.ExecRequest], command: Command, errors: queue.Queue[Refusal]
) -> None:
    """Feed stdin chunks, close_stdin and signals from the client to the command."""
    try:
        for request in requests:
            kind = request.WhichOneof("kind")
            if kind == "stdin":
                command.write_stdin(request.stdin)
            elif kind == "close_stdin":
                command.close_stdin()
            elif kind == "signal":
                if not 1 <= request.signal <= MAX_SIGNAL:
                    raise invalid(f"signal {request.signal} is not a valid signal number")
                command.signal(request.signal)
            else:
                raise invalid("`start` may only be the first ExecRequest")
        command.close_stdin()
    except Refusal as exc:
        errors.put(exc)
        command.kill()
    except Exception:  # the client's stream broke: the call is ending anyway
        command.kill()


def _unscripted(command: str) -> Refusal:
    return Refusal(
        grpc.StatusCode.FAILED_PRECONDITION,
        "EXECUTABLE_NOT_FOUND",
        f"no scripted result for {command[:200]!r} "
        "(this FakeOrchard runs no host commands: add fake.on_exec(...))",
    )


def register(
    world: World, runtimes: SandboxRuntimes, scripts: Scripts, run_commands: bool
) -> list[tuple[Any, Any]]:
    servicer = FakeExecutorService(world, runtimes, scripts, run_commands)
    return [(pb_grpc.add_ExecutorServiceServicer_to_server, servicer)]
