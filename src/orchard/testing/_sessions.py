"""Persistent shell sessions of the fake executor: one host ``bash`` per session.

The shell reads NUL-terminated commands from a pipe and ``eval``s each at top
level, so ``cd``, variables, functions and ``export`` persist between runs,
as in the real executor. After each command it prints a per-session marker
on stdout and stderr and writes the exit code to a status pipe; output is cut
at the markers. ``interrupt`` sends SIGINT to the session's process group:
the running command dies and the shell's trap reports 130. A command that
outlives its timeout is interrupted, and the session is killed (dead) if
that is not enough.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import selectors
import signal as signals
import subprocess
import threading
import time
from pathlib import Path

import grpc

from orchard._proto.orchard.v1 import executor_pb2 as pb

from ._process import ProcessGroups
from ._status import Refusal, precondition

INTERRUPT_GRACE_SECONDS = 1.0
MARKER_WAIT_SECONDS = 2.0

# $1 marker, $2 the command fd, $3 the status fd.
_LOOP = r"""
__m=$1; __cfd=$2; __sfd=$3; __p=0
trap 'if [ "$__p" = 1 ]; then __rc=130; continue 1000; fi' INT
while :; do
  if [ "$__p" = 1 ]; then
    __p=0
    printf '%s' "$__m"; printf '%s' "$__m" >&2; printf '%d\0' "$__rc" >&"$__sfd"
  fi
  IFS= read -r -d '' __cmd <&"$__cfd"; __r=$?
  if [ "$__r" -ne 0 ]; then [ "$__r" -gt 128 ] && continue; break; fi
  __rc=130; __p=1
  eval "$__cmd" </dev/null
  __rc=$?
done
"""


class ShellSession:
    def __init__(self, session_id: str, cwd: Path, env: dict[str, str], groups: ProcessGroups):
        self.session_id = session_id
        self._marker = f"\x1eorchard-fake-{secrets.token_hex(12)}\x1e".encode()
        cmd_r, self._cmd_w = os.pipe()
        self._status_r, status_w = os.pipe()
        try:
            self._proc = subprocess.Popen(
                [
                    "bash",
                    "--noprofile",
                    "--norc",
                    "-c",
                    _LOOP,
                    "orchard-session",
                    self._marker.decode(),
                    str(cmd_r),
                    str(status_w),
                ],
                cwd=cwd,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                pass_fds=(cmd_r, status_w),
                start_new_session=True,
            )
        except OSError:
            os.close(self._cmd_w)
            os.close(self._status_r)
            raise
        finally:
            os.close(cmd_r)
            os.close(status_w)
        self._groups = groups
        groups.add(self._proc.pid)
        self._cond = threading.Condition()
        self._out = bytearray()
        self._err = bytearray()
        self._statuses = bytearray()
        self._eof = False
        self.busy = False
        self.dead_reason: str | None = None
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self._proc.stdout is not None and self._proc.stderr is not None
        selector = selectors.DefaultSelector()
        selector.register(self._proc.stdout, selectors.EVENT_READ, self._out)
        selector.register(self._proc.stderr, selectors.EVENT_READ, self._err)
        selector.register(self._status_r, selectors.EVENT_READ, self._statuses)
        try:
            while selector.get_map():
                for key, _ in selector.select(0.2):
                    data = os.read(key.fd, 65536)
                    with self._cond:
                        if data:
                            key.data.extend(data)
                        else:
                            selector.unregister(key.fileobj)
                        self._cond.notify_all()
        finally:
            selector.close()
            with self._cond:
                self._eof = True
                self._cond.notify_all()

    def _status_ready(self) -> bool:
        return b"\0" in self._statuses

    def _wait(self, ready: object, seconds: float | None) -> bool:
        deadline = None if seconds is None else time.monotonic() + seconds
        with self._cond:
            while not ready():  # type: ignore[operator]
                if self._eof:
                    return bool(ready())  # type: ignore[operator]
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    return False
                self._cond.wait(0.2 if remaining is None else min(remaining, 0.2))
        return True

    def run(self, command: str, timeout: float, limit: int) -> pb.RunResponse:
        with self._cond:
            if self.busy:
                raise precondition(
                    f"session {self.session_id} is already running a command", "SESSION_BUSY"
                )
            if self.dead_reason is not None or self._proc.poll() is not None:
                raise precondition(
                    f"session {self.session_id} has ended: {self.dead_reason or 'the shell exited'}",
                    "SESSION_DEAD",
                )
            self.busy = True
        started = time.monotonic()
        try:
            try:
                os.write(self._cmd_w, command.encode("utf-8", "surrogateescape") + b"\0")
            except OSError as err:
                self.dead_reason = f"the shell is gone ({err.strerror})"
                raise precondition(f"session {self.session_id} has ended", "SESSION_DEAD") from err
            timed_out = False
            done = self._wait(self._status_ready, timeout if timeout > 0 else None)
            if not done and self._proc.poll() is None:
                timed_out = True
                self.interrupt()
                done = self._wait(self._status_ready, INTERRUPT_GRACE_SECONDS)
                if not done:
                    self.dead_reason = "killed: a command timed out and ignored SIGINT"
                    self.kill()
            return self._response(done, timed_out, limit, time.monotonic() - started)
        finally:
            with self._cond:
                self.busy = False

    def _response(self, done: bool, timed_out: bool, limit: int, duration: float) -> pb.RunResponse:
        marker = self._marker
        if done:
            self._wait(lambda: marker in self._out and marker in self._err, MARKER_WAIT_SECONDS)
        else:
            self._wait(lambda: False, 0.1 if self.dead_reason is None else 1.0)
        with self._cond:
            stdout = self._take(self._out, marker)
            stderr = self._take(self._err, marker)
            code, signal = 0, 0
            if done:
                raw, _, rest = bytes(self._statuses).partition(b"\0")
                self._statuses[:] = rest
                code = int(raw or b"0")
            else:
                rc = self._proc.poll()
                if rc is None:
                    rc = self._proc.wait(5)
                code, signal = rc, (0 if rc >= 0 else -rc)  # -N: common/exit_codes.py
                self.dead_reason = self.dead_reason or "the shell exited"
                stderr += f"\norchard: session ended: {self.dead_reason}\n".encode()
        status = pb.ExecStatus(
            exit_code=code,
            signal=signal,
            timed_out=timed_out,
            stdout_truncated=len(stdout) > limit,
            stderr_truncated=len(stderr) > limit,
            truncated=len(stdout) > limit or len(stderr) > limit,
            duration_seconds=duration,
        )
        return pb.RunResponse(stdout=stdout[:limit], stderr=stderr[:limit], status=status)

    @staticmethod
    def _take(buffer: bytearray, marker: bytes) -> bytes:
        index = buffer.find(marker)
        if index < 0:
            data = bytes(buffer)
            buffer.clear()
            return data
        data = bytes(buffer[:index])
        del buffer[: index + len(marker)]
        return data

    def interrupt(self) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self._proc.pid, signals.SIGINT)

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self._proc.pid, signals.SIGKILL)

    def close(self) -> None:
        self.kill()
        with contextlib.suppress(OSError):
            os.close(self._cmd_w)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self._proc.wait(5)
        self._reader.join(5)
        with contextlib.suppress(OSError):
            os.close(self._status_r)
        for pipe in (self._proc.stdout, self._proc.stderr):
            if pipe is not None:
                pipe.close()
        self._groups.discard(self._proc.pid)


class ScriptedSession:
    """A session of a fake that runs nothing on the host: every command must be scripted."""

    def __init__(self, session_id: str) -> None:
        self.session_id = session_id
        self.busy = False

    def interrupt(self) -> None:
        pass

    def close(self) -> None:
        pass

    def run(self, command: str, timeout: float, limit: int) -> pb.RunResponse:
        raise Refusal(
            grpc.StatusCode.FAILED_PRECONDITION,
            "EXECUTABLE_NOT_FOUND",
            f"no scripted result for session command {command[:200]!r} "
            "(this FakeOrchard runs no host commands: add fake.on_exec(...))",
        )
