"""What runs in each fake sandbox: its process groups and its shell sessions."""

from __future__ import annotations

import signal as signals
import threading
from dataclasses import dataclass, field

from ._background import FakeProcesses
from ._process import ProcessGroups
from ._sessions import ScriptedSession, ShellSession
from ._status import not_found, precondition

MAX_SESSIONS = 256


@dataclass
class SandboxRuntime:
    groups: ProcessGroups = field(default_factory=ProcessGroups)
    # A session that died (timed out past SIGINT, shell exited) stays here and answers
    # SESSION_DEAD; a closed one is removed and answers SESSION_NOT_FOUND.
    sessions: dict[str, ShellSession | ScriptedSession] = field(default_factory=dict)
    processes: FakeProcesses = field(default_factory=FakeProcesses)


class SandboxRuntimes:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._runtimes: dict[str, SandboxRuntime] = {}

    def of(self, sandbox_id: str) -> SandboxRuntime:
        with self._lock:
            return self._runtimes.setdefault(sandbox_id, SandboxRuntime())

    def add_session(self, sandbox_id: str, session: ShellSession | ScriptedSession) -> None:
        runtime = self.of(sandbox_id)
        with self._lock:
            if len(runtime.sessions) >= MAX_SESSIONS:
                session.close()
                raise precondition(
                    f"this sandbox already has {MAX_SESSIONS} sessions; close some first",
                    "QUOTA_EXCEEDED",
                )
            runtime.sessions[session.session_id] = session

    def session(self, sandbox_id: str, session_id: str) -> ShellSession | ScriptedSession:
        runtime = self.of(sandbox_id)
        with self._lock:
            session = runtime.sessions.get(session_id)
            if session is None:
                raise not_found(
                    f"session {session_id[:80]!r} does not exist in sandbox {sandbox_id}",
                    "SESSION_NOT_FOUND",
                )
        return session

    def close_session(self, sandbox_id: str, session_id: str) -> None:
        self.session(sandbox_id, session_id)
        runtime = self.of(sandbox_id)
        with self._lock:
            session = runtime.sessions.pop(session_id, None)
        if session is not None:
            session.close()

    def discard(self, sandbox_id: str) -> None:
        """The sandbox is deleted: end its sessions and kill every process it started."""
        with self._lock:
            runtime = self._runtimes.pop(sandbox_id, None)
        if runtime is None:
            return
        for session in runtime.sessions.values():
            session.close()
        runtime.processes.kill_all()
        runtime.groups.signal_all(signals.SIGKILL)

    def discard_all(self) -> None:
        with self._lock:
            ids = list(self._runtimes)
        for sandbox_id in ids:
            self.discard(sandbox_id)
