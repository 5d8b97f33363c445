"""Scripted command results: ``fake.on_exec(matcher, result)``.

Rollout code can be unit-tested without running anything on the host: a
command whose :class:`ExecCall` matches a script gets the script's
:class:`ScriptedResult` (through the same Run / Exec / SessionRun answers, output
caps included) and starts no process. Scripts are tried newest first; with
``FakeOrchard(run_commands=False)`` a command no script matches is refused
(FAILED_PRECONDITION / EXECUTABLE_NOT_FOUND: the SDK raises
``CommandStartError``), so nothing runs on the host by accident.
"""

from __future__ import annotations

import re
import shlex
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

from orchard._proto.orchard.v1 import executor_pb2 as pb


@dataclass(frozen=True)
class ExecCall:
    """One command as the fake executor received it (what matchers and handlers see)."""

    sandbox_id: str
    argv: tuple[str, ...]
    """The argument vector; a shell command is ``("/bin/sh", "-c", text)``."""
    shell: str | None
    """The shell text for a shell command, else None."""
    cwd: str
    """The working directory as a sandbox path."""
    env: dict[str, str]
    """The request's own env (not the sandbox's)."""
    user: str
    stdin: bytes
    timeout: float
    session_id: str | None = None

    @property
    def command(self) -> str:
        """The shell text, or the argv joined as a shell would quote it."""
        return self.shell if self.shell is not None else shlex.join(self.argv)


@dataclass(frozen=True)
class ScriptedResult:
    stdout: bytes | str = b""
    stderr: bytes | str = b""
    exit_code: int = 0
    signal: int = 0
    timed_out: bool = False
    oom_killed: bool = False
    duration_seconds: float = 0.0

    def events(self, limit: int) -> list[pb.ExecEvent]:
        out, err = _raw(self.stdout), _raw(self.stderr)
        status = pb.ExecStatus(
            exit_code=self.exit_code,
            signal=self.signal,
            timed_out=self.timed_out,
            oom_killed=self.oom_killed,
            stdout_truncated=len(out) > limit,
            stderr_truncated=len(err) > limit,
            truncated=len(out) > limit or len(err) > limit,
            duration_seconds=self.duration_seconds,
        )
        events = []
        if out:
            events.append(pb.ExecEvent(stdout=out[:limit]))
        if err:
            events.append(pb.ExecEvent(stderr=err[:limit]))
        events.append(pb.ExecEvent(exit=status))
        return events

    def response(self, limit: int) -> pb.RunResponse:
        response = pb.RunResponse()
        for event in self.events(limit):
            kind = event.WhichOneof("kind")
            if kind == "exit":
                response.status.CopyFrom(event.exit)
            else:
                setattr(response, kind, getattr(event, kind))  # type: ignore[arg-type]
        return response


def _raw(data: bytes | str) -> bytes:
    return data.encode() if isinstance(data, str) else data


Matcher = str | re.Pattern[str] | Callable[[ExecCall], bool]
Handler = ScriptedResult | str | bytes | Callable[[ExecCall], ScriptedResult]


@dataclass
class _Script:
    matcher: Matcher
    handler: Handler
    times: int | None
    calls: list[ExecCall] = field(default_factory=list)

    def matches(self, call: ExecCall) -> bool:
        if self.times is not None and len(self.calls) >= self.times:
            return False
        m = self.matcher
        if isinstance(m, str):
            return call.command == m
        if isinstance(m, re.Pattern):
            return m.search(call.command) is not None
        return bool(m(call))

    def result(self, call: ExecCall) -> ScriptedResult:
        h = self.handler
        if isinstance(h, ScriptedResult):
            return h
        if isinstance(h, (str, bytes)):
            return ScriptedResult(stdout=h)
        return h(call)


class Scripts:
    """The scripts of one fake, and every command it was asked to run."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._scripts: list[_Script] = []
        self.calls: list[ExecCall] = []

    def add(self, matcher: Matcher, handler: Handler, times: int | None) -> None:
        with self._lock:
            self._scripts.insert(0, _Script(matcher, handler, times))

    def matches(self, call: ExecCall) -> bool:
        """Whether a script would answer ``call`` (nothing is recorded)."""
        with self._lock:
            return any(script.matches(call) for script in self._scripts)

    def find(self, call: ExecCall) -> ScriptedResult | None:
        """The scripted result for ``call``, or None; every call is recorded."""
        with self._lock:
            self.calls.append(call)
            for script in self._scripts:
                if script.matches(call):
                    script.calls.append(call)
                    break
            else:
                return None
        return script.result(call)
