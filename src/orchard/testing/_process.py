"""Commands of the fake executor: host subprocesses with the real executor's outcomes.

Each command runs in its own session (a new process group) so a timeout, a
cancelled call, a signal or KillAll reaches the whole tree, as with the real
executor. Output is read with one ``selectors`` loop, capped per stream
(``truncated``), and the outcome follows the real one: exit code, or
``exit_code=-N`` and ``signal=N`` for signal N; a command that cannot start
is a finished exec with a shell's code (127 not found, 126 not executable or
bad working directory), not an RPC error. After the command exits its pipes
get a short grace to reach EOF (a background job may hold them open).
"""

from __future__ import annotations

import contextlib
import os
import selectors
import signal as signals
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from orchard._proto.orchard.v1 import executor_pb2 as pb

DRAIN_GRACE_SECONDS = 0.1
READ_BYTES = 64 * 1024


@dataclass(frozen=True)
class CommandSpec:
    argv: tuple[str, ...]
    env: dict[str, str]
    cwd: Path
    shown_cwd: str
    timeout: float
    limit: int
    stdin: bool


class ProcessGroups:
    """The process groups a sandbox's commands run in (for KillAll and delete).

    A group stays known after its command exits while anything still runs in
    it (``server &``), so KillAll and delete reach what commands left behind.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._groups: set[int] = set()

    def add(self, pgid: int) -> None:
        with self._lock:
            self._groups.add(pgid)

    def discard(self, pgid: int) -> None:
        with self._lock:
            self._groups.discard(pgid)

    def members(self) -> list[int]:
        """Pids of live processes in the groups (from /proc); empty groups are forgotten."""
        with self._lock:
            groups = set(self._groups)
        pids = []
        alive: set[int] = set()
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                with open(f"/proc/{entry}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            pgid = int(fields[2])
            if fields[0] != "Z" and pgid in groups:
                pids.append(int(entry))
                alive.add(pgid)
        with self._lock:
            self._groups -= groups - alive
        return pids

    def signal_all(self, signum: int) -> int:
        """Signal every group; returns how many processes were in them."""
        count = len(self.members())
        with self._lock:
            groups = list(self._groups)
        for pgid in groups:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pgid, signum)
        return count


def start_failure(spec: CommandSpec, err: OSError) -> tuple[int, bytes]:
    name = spec.argv[0]
    if isinstance(err, FileNotFoundError) and not spec.cwd.is_dir():
        return (
            126,
            f"orchard: cannot change directory to {spec.shown_cwd}: {err.strerror}\n".encode(),
        )
    if isinstance(err, NotADirectoryError):
        return (
            126,
            f"orchard: cannot change directory to {spec.shown_cwd}: {err.strerror}\n".encode(),
        )
    if isinstance(err, FileNotFoundError):
        if "/" in name:
            return 127, f"orchard: {name}: No such file or directory\n".encode()
        return 127, f"orchard: {name}: command not found\n".encode()
    return 126, f"orchard: {name}: {err.strerror}\n".encode()


class Command:
    """One running command: start it, feed it, signal it, read its events."""

    def __init__(self, spec: CommandSpec, groups: ProcessGroups) -> None:
        self.spec = spec
        self._groups = groups
        self._proc: subprocess.Popen[bytes] | None = None
        self._failure: tuple[int, bytes] | None = None
        self._killed_for_timeout = False
        self._lock = threading.Lock()

    def start(self) -> None:
        spec = self.spec
        try:
            self._proc = subprocess.Popen(
                spec.argv,
                cwd=spec.cwd,
                env=spec.env,
                stdin=subprocess.PIPE if spec.stdin else subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                start_new_session=True,
            )
        except OSError as err:
            self._failure = start_failure(spec, err)
            return
        self._groups.add(self._proc.pid)

    @property
    def failure(self) -> tuple[int, bytes] | None:
        """(exit code, shell message) when the command could not start."""
        return self._failure

    @property
    def pid(self) -> int | None:
        """The started command's pid (None before start or if it could not start)."""
        return self._proc.pid if self._proc is not None else None

    def write_stdin(self, data: bytes) -> None:
        proc = self._proc
        if proc is not None and proc.stdin is not None:
            with contextlib.suppress(BrokenPipeError, ValueError, OSError):
                proc.stdin.write(data)
                proc.stdin.flush()

    def close_stdin(self) -> None:
        proc = self._proc
        if proc is not None and proc.stdin is not None:
            with contextlib.suppress(BrokenPipeError, OSError):
                proc.stdin.close()

    def signal(self, signum: int) -> None:
        if self._proc is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self._proc.pid, signum)

    def kill(self) -> None:
        self.signal(signals.SIGKILL)

    def events(self) -> Iterator[pb.ExecEvent]:
        """Output events as they come, then the exit event."""
        started = time.monotonic()
        if self._failure is not None:
            code, message = self._failure
            yield pb.ExecEvent(stderr=message)
            yield pb.ExecEvent(exit=pb.ExecStatus(exit_code=code))
            return
        proc = self._proc
        assert proc is not None and proc.stdout is not None and proc.stderr is not None
        spec = self.spec
        deadline = started + spec.timeout if spec.timeout > 0 else None
        kept = {"stdout": 0, "stderr": 0}
        truncated = {"stdout": False, "stderr": False}
        selector = selectors.DefaultSelector()
        selector.register(proc.stdout, selectors.EVENT_READ, "stdout")
        selector.register(proc.stderr, selectors.EVENT_READ, "stderr")
        drain_until: float | None = None
        try:
            while selector.get_map():
                now = time.monotonic()
                if deadline is not None and now >= deadline and not self._killed_for_timeout:
                    self._killed_for_timeout = True
                    self.kill()
                if drain_until is None and proc.poll() is not None:
                    drain_until = now + DRAIN_GRACE_SECONDS
                if drain_until is not None and now >= drain_until:
                    break
                wait = 0.05
                if deadline is not None and not self._killed_for_timeout:
                    wait = min(wait, max(0.0, deadline - now))
                for key, _ in selector.select(wait):
                    stream = key.data
                    data = os.read(key.fd, READ_BYTES)
                    if not data:
                        selector.unregister(key.fileobj)
                        continue
                    room = spec.limit - kept[stream]
                    if len(data) > room:
                        truncated[stream] = True
                        data = data[: max(room, 0)]
                    if data:
                        kept[stream] += len(data)
                        yield (
                            pb.ExecEvent(stdout=data)
                            if stream == "stdout"
                            else pb.ExecEvent(stderr=data)
                        )
            code = proc.wait()
        finally:
            selector.close()
            proc.stdout.close()
            proc.stderr.close()
        yield pb.ExecEvent(
            exit=pb.ExecStatus(
                exit_code=code,  # subprocess's -N is also the API's (common/exit_codes.py)
                signal=-code if code < 0 else 0,
                timed_out=self._killed_for_timeout,
                truncated=truncated["stdout"] or truncated["stderr"],
                stdout_truncated=truncated["stdout"],
                stderr_truncated=truncated["stderr"],
                duration_seconds=time.monotonic() - started,
            )
        )

    def run(self, stdin: bytes) -> pb.RunResponse:
        """Start, feed ``stdin`` whole, wait; the whole (capped) output."""
        self.start()
        feeder = None
        if self.spec.stdin:
            feeder = threading.Thread(target=self._feed, args=(stdin,), daemon=True)
            feeder.start()
        out: list[bytes] = []
        err: list[bytes] = []
        status = pb.ExecStatus()
        for event in self.events():
            kind = event.WhichOneof("kind")
            if kind == "stdout":
                out.append(event.stdout)
            elif kind == "stderr":
                err.append(event.stderr)
            else:
                status = event.exit
        return pb.RunResponse(stdout=b"".join(out), stderr=b"".join(err), status=status)

    def _feed(self, data: bytes) -> None:
        self.write_stdin(data)
        self.close_stdin()
