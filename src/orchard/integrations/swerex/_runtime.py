"""``OrchardRuntime``: SWE-ReX's ``AbstractRuntime`` over one Orchard sandbox.

Where SWE-ReX's own runtime (a pexpect bash on the sandbox side) and Orchard
differ, the SWE-ReX behaviour is rebuilt here:

- a bash session is an Orchard session (cwd, variables and functions persist);
  each command is ``eval``'d with stderr on stdout, as a terminal shows them,
  and its output comes without the final line break, as SWE-ReX's prompt cut
  leaves it; a command bash cannot parse is refused first
  (``BashIncorrectSyntaxError``, one ``bash -n`` in the sandbox), since a
  persistent shell must never be fed half a command;
- a timeout interrupts the command (the session survives) and raises
  ``CommandTimeoutError``; ``BashInterruptAction`` sends SIGINT;
- ``execute`` keeps ``subprocess.run``'s meaning of ``shell``, ``env``
  (replaces the environment) and return codes (``-N`` for signal N);
- ``read_file`` decodes like ``Path.read_text(encoding, errors)``.

Not possible on today's SDK: interactive programs in a session
(``is_interactive_command``, ``expect``) need a terminal; they raise
``NotImplementedError`` rather than half work.
"""

from __future__ import annotations

import asyncio
import io
import logging
import os
import shlex

from swerex.exceptions import (
    BashIncorrectSyntaxError,
    CommandTimeoutError,
    NonZeroExitCodeError,
    SessionDoesNotExistError,
    SessionExistsError,
)
from swerex.runtime.abstract import (
    AbstractRuntime,
    Action,
    BashInterruptAction,
    BashObservation,
    CloseBashSessionResponse,
    CloseResponse,
    CloseSessionRequest,
    CloseSessionResponse,
    Command,
    CommandResponse,
    CreateBashSessionResponse,
    CreateSessionRequest,
    CreateSessionResponse,
    IsAliveResponse,
    Observation,
    ReadFileRequest,
    ReadFileResponse,
    UploadRequest,
    UploadResponse,
    WriteFileRequest,
    WriteFileResponse,
)

import orchard

from ._errors import swerex_errors

_MERGE_STREAMS = 'exec "$@" 2>&1'


class OrchardRuntime(AbstractRuntime):
    """SWE-ReX operations on one Orchard sandbox (its lifecycle is the deployment's)."""

    def __init__(
        self, sandbox: orchard.AsyncSandbox, *, logger: logging.Logger | None = None
    ) -> None:
        self.sandbox = sandbox
        self.logger = logger or logging.getLogger("rex-runtime")
        self.sessions: dict[str, orchard.AsyncSession] = {}

    async def is_alive(self, *, timeout: float | None = None) -> IsAliveResponse:  # noqa: ASYNC109 (SWE-ReX's signature)
        """Alive when a command runs in the sandbox (the data plane answers, not just the control plane)."""
        try:
            result = await self.sandbox.exec(["true"], timeout=timeout or 10)
        except orchard.OrchardError as err:
            return IsAliveResponse(is_alive=False, message=f"{type(err).__name__}: {err.message}")
        if result.exit_code != 0:
            return IsAliveResponse(is_alive=False, message=f"`true` exited {result.exit_code}")
        return IsAliveResponse(is_alive=True)

    # ---- sessions -------------------------------------------------------------

    async def create_session(self, request: CreateSessionRequest) -> CreateSessionResponse:
        if request.session in self.sessions:
            raise SessionExistsError(f"session {request.session} already exists")
        with swerex_errors():
            session = await self.sandbox.session()
        self.sessions[request.session] = session
        output = ""
        if request.startup_source:
            script = "; ".join(f"source {shlex.quote(p)}" for p in request.startup_source)
            with swerex_errors():
                result = await session.run(_merged(script), timeout=request.startup_timeout)
            output = result.stdout_text
        return CreateBashSessionResponse(output=output)

    async def run_in_session(self, action: Action) -> Observation:
        session = self._session(action.session)
        if isinstance(action, BashInterruptAction):
            with swerex_errors():
                await session.interrupt()
            return BashObservation(output="", exit_code=0)
        if action.is_interactive_command or action.is_interactive_quit or action.expect:
            raise NotImplementedError(
                "interactive commands (is_interactive_command, expect) need a terminal session, "
                "which the Orchard runtime does not offer yet"
            )
        await self._check_syntax(action.command)
        with swerex_errors():
            result = await session.run(_merged(action.command), timeout=action.timeout)
        output = result.stdout_text.removesuffix("\n")
        if result.timed_out:
            raise CommandTimeoutError(
                f"timeout after {action.timeout} seconds while running command {action.command!r}"
            )
        exit_code = None if action.check == "ignore" else _returncode(result)
        if action.check == "raise" and exit_code != 0:
            msg = f"Command {action.command!r} failed with exit code {exit_code}. Here is the output:\n{output!r}"
            raise NonZeroExitCodeError(f"{action.error_msg}: {msg}" if action.error_msg else msg)
        return BashObservation(output=output, exit_code=exit_code)

    async def _check_syntax(self, command: str) -> None:
        with swerex_errors():
            result = await self.sandbox.exec(["bash", "-n"], stdin=command, timeout=10)
        if result.exit_code != 0:
            raise BashIncorrectSyntaxError(
                f"Error (exit code {result.exit_code}) while checking bash command \n{command!r}\n"
                f"---- Stderr ----\n{result.stderr_text}\n---- Stdout ----\n{result.stdout_text}",
                extra_info={"bash_stdout": result.stdout_text, "bash_stderr": result.stderr_text},
            )

    async def close_session(self, request: CloseSessionRequest) -> CloseSessionResponse:
        session = self._session(request.session)
        del self.sessions[request.session]
        with swerex_errors():
            await session.close()
        return CloseBashSessionResponse()

    def _session(self, name: str) -> orchard.AsyncSession:
        if name not in self.sessions:
            raise SessionDoesNotExistError(f"session {name!r} does not exist")
        return self.sessions[name]

    # ---- commands and files ---------------------------------------------------

    async def execute(self, command: Command) -> CommandResponse:
        argv = _argv(command)
        if command.env is not None:  # subprocess: env replaces the environment
            argv = ["env", "-i", *(f"{k}={v}" for k, v in command.env.items()), *argv]
        if command.merge_output_streams:
            argv = ["/bin/sh", "-c", _MERGE_STREAMS, "sh", *argv]
        with swerex_errors():
            result = await self.sandbox.exec(argv, timeout=command.timeout, cwd=command.cwd)
        if result.timed_out:
            raise CommandTimeoutError(
                f"Timeout ({command.timeout}s) exceeded while running command"
            )
        response = CommandResponse(
            stdout=result.stdout.decode(errors="backslashreplace"),
            stderr=result.stderr.decode(errors="backslashreplace"),
            exit_code=_returncode(result),
        )
        if command.check and response.exit_code != 0:
            msg = (
                f"Command {command.command!r} failed with exit code {response.exit_code}. "
                f"Stdout:\n{response.stdout!r}\nStderr:\n{response.stderr!r}"
            )
            raise NonZeroExitCodeError(f"{command.error_msg}: {msg}" if command.error_msg else msg)
        return response

    async def read_file(self, request: ReadFileRequest) -> ReadFileResponse:
        with swerex_errors(request.path):
            data = await self.sandbox.read_file(request.path)
        text = io.TextIOWrapper(
            io.BytesIO(data), encoding=request.encoding or "utf-8", errors=request.errors
        )
        return ReadFileResponse(content=text.read())

    async def write_file(self, request: WriteFileRequest) -> WriteFileResponse:
        with swerex_errors(request.path):
            await self.sandbox.write_file(request.path, request.content, make_parents=True)
        return WriteFileResponse()

    async def upload(self, request: UploadRequest) -> UploadResponse:
        """A local file or directory to ``target_path`` (a directory's contents go into it)."""
        source = request.source_path
        with swerex_errors(request.target_path):
            if await asyncio.to_thread(os.path.isdir, source):
                await self.sandbox.upload(source, request.target_path)
            else:
                f = await asyncio.to_thread(open, source, "rb")
                try:
                    await self.sandbox.write_file(request.target_path, f, make_parents=True)
                finally:
                    f.close()
        return UploadResponse()

    async def close(self) -> CloseResponse:
        """Close every session (the sandbox stays: the deployment deletes it)."""
        sessions, self.sessions = list(self.sessions.values()), {}
        for session in sessions:
            try:
                await session.close()
            except orchard.OrchardError as err:
                self.logger.warning("could not close session %s: %s", session.id, err)
        return CloseResponse()


def _merged(command: str) -> str:
    """The command eval'd in the session's own shell, stderr on stdout."""
    return f"eval {shlex.quote(command)} 2>&1"


def _argv(command: Command) -> list[str]:
    """``subprocess.run``'s reading of ``command`` and ``shell``."""
    if command.shell:
        if isinstance(command.command, str):
            return ["/bin/sh", "-c", command.command]
        return ["/bin/sh", "-c", *command.command]
    if isinstance(command.command, str):
        return [command.command]
    return list(command.command)


def _returncode(result: orchard.ExecResult) -> int:
    """subprocess's convention: ``-N`` for a command killed by signal N."""
    if result.status.signal:  # whatever exit_code convention the SDK reports it in
        return -result.status.signal
    return result.exit_code


__all__ = ["OrchardRuntime"]
