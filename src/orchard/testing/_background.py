"""Background processes and terminals of the fake executor: host subprocesses.

The same contract as ``services/executor/background.py``: a process runs on
without any stream tied to it, its output (both streams, in the order read)
is kept in a buffer of :data:`BUFFER_BYTES` whose oldest bytes are dropped
first and counted, readers attach from any offset, and a finished process's
result is kept (at most :data:`KEEP_FINISHED` per sandbox). A terminal is a
host pseudo-terminal (``os.openpty``) whose slave is the command's
controlling terminal. What differs from the real one: no per-tenant output
ledger (one process's buffer is the only bound) and no time limit on kept
results. One reader thread per process; attachers wait on a condition.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import secrets
import struct
import subprocess
import termios
import threading
import time
from collections import deque
from collections.abc import Iterator

import grpc

from orchard._proto.orchard.v1 import executor_pb2 as pb

from ._process import Command, CommandSpec, ProcessGroups
from ._status import Refusal, invalid, not_found, precondition

BUFFER_BYTES = 1 << 20
KEEP_FINISHED = 32
MAX_LIVE = 64
MAX_TERMINAL_SIDE = 4096
STDOUT, STDERR = 1, 2


def check_pty_size(size: pb.PtySize) -> tuple[int, int]:
    if not (1 <= size.rows <= MAX_TERMINAL_SIDE and 1 <= size.cols <= MAX_TERMINAL_SIDE):
        raise invalid(
            f"terminal size {size.rows}x{size.cols}: rows and cols must be 1..{MAX_TERMINAL_SIDE}"
        )
    return size.rows, size.cols


class FakeProcess:
    """One background command and its bounded output."""

    def __init__(self, sandbox_id: str, argv: tuple[str, ...]) -> None:
        self.process_id = f"p-{secrets.token_hex(8)}"
        self.sandbox_id = sandbox_id
        self.argv = argv
        self.started_at = time.time()
        self.pty = False
        self.pid = 0
        self.status: pb.ExecStatus | None = None
        self.ended_at = 0.0
        self._chunks: deque[tuple[int, int, bytes]] = deque()  # (offset, stream, data)
        self._held = 0
        self.start = 0
        self.end = 0
        self.changed = threading.Condition()
        self._command: Command | None = None
        self._master: int | None = None
        self._proc: subprocess.Popen[bytes] | None = None

    # ---- output

    def append(self, stream: int, data: bytes) -> None:
        with self.changed:
            if len(data) > BUFFER_BYTES:
                self.end += len(data) - BUFFER_BYTES
                data = data[-BUFFER_BYTES:]
                if not self._chunks:
                    self.start = self.end
            while self._chunks and self._held + len(data) > BUFFER_BYTES:
                _, _, old = self._chunks.popleft()
                self._held -= len(old)
                self.start = self._chunks[0][0] if self._chunks else self.end
            self._chunks.append((self.end, stream, data))
            self._held += len(data)
            self.end += len(data)
            self.changed.notify_all()

    def finish(self, status: pb.ExecStatus) -> None:
        with self.changed:
            if self.start > 0:
                status.truncated = status.stdout_truncated = True
                status.stderr_truncated = not self.pty
            self.status = status
            self.ended_at = time.monotonic()
            self.changed.notify_all()

    def read_from(self, offset: int) -> tuple[int, list[tuple[int, int, bytes]]]:
        """(dropped before ``offset``, chunks from it); call with ``changed`` held."""
        dropped = max(0, self.start - offset)
        chunks = []
        for start, stream, data in self._chunks:
            if start + len(data) <= offset:
                continue
            if start < offset:
                data, start = data[offset - start :], offset
            chunks.append((start, stream, data))
        return dropped, chunks

    def stream_bytes(self, stream: int) -> bytes:
        with self.changed:
            return b"".join(d for _, s, d in self._chunks if s == stream)

    # ---- running

    def run_pipes(self, command: Command) -> None:
        self._command = command
        command.start()
        self.pid = command.pid or 0
        threading.Thread(target=self._pump_pipes, args=(command,), daemon=True).start()

    def _pump_pipes(self, command: Command) -> None:
        for event in command.events():
            kind = event.WhichOneof("kind")
            if kind == "stdout":
                self.append(STDOUT, event.stdout)
            elif kind == "stderr":
                self.append(STDERR, event.stderr)
            else:
                self.finish(event.exit)

    def run_terminal(self, spec: CommandSpec, size: tuple[int, int], groups: ProcessGroups) -> None:
        self.pty = True
        master, slave = os.openpty()
        fcntl.ioctl(master, termios.TIOCSWINSZ, struct.pack("HHHH", size[0], size[1], 0, 0))
        try:
            self._proc = subprocess.Popen(
                spec.argv,
                cwd=spec.cwd,
                env=spec.env,
                stdin=slave,
                stdout=slave,
                stderr=slave,
                start_new_session=True,
                preexec_fn=_take_terminal,
            )
        except OSError as err:
            os.close(master)
            raise precondition(
                f"orchard: {spec.argv[0]}: {err.strerror}", "EXECUTABLE_NOT_FOUND"
            ) from None
        finally:
            os.close(slave)
        self._master = master
        self.pid = self._proc.pid
        groups.add(self._proc.pid)
        threading.Thread(target=self._pump_terminal, args=(spec.timeout,), daemon=True).start()

    def _pump_terminal(self, timeout: float) -> None:
        proc, master = self._proc, self._master
        assert proc is not None and master is not None
        started = time.monotonic()
        timed_out = False
        while True:
            try:
                data = os.read(master, 65536)
            except OSError:
                data = b""
            if not data:
                break
            self.append(STDOUT, data)
            if timeout > 0 and time.monotonic() - started > timeout and not timed_out:
                timed_out = True
                self.signal(9)
        code = proc.wait()
        self._master = None
        os.close(master)
        self.finish(
            pb.ExecStatus(
                exit_code=code,  # subprocess's -N, the API's too (common/exit_codes.py)
                signal=-code if code < 0 else 0,
                timed_out=timed_out,
                duration_seconds=time.monotonic() - started,
            )
        )

    # ---- input

    def write(self, data: bytes) -> None:
        if self.status is not None:
            raise precondition(f"process {self.process_id} is not running", "PROCESS_STATE")
        if self._master is not None:
            os.write(self._master, data)
        elif self._command is not None and self._command.spec.stdin:
            self._command.write_stdin(data)
        else:
            raise precondition(
                f"process {self.process_id} was started without stdin (start it with stdin)",
                "PROCESS_STATE",
            )

    def close_stdin(self) -> None:
        if self.pty:
            raise precondition(
                "a terminal's input has no end; send b'\\x04' (Ctrl-D) or a signal",
                "PROCESS_STATE",
            )
        if self._command is not None:
            self._command.close_stdin()

    def signal(self, signum: int) -> None:
        if not 1 <= signum <= 64:
            raise invalid(f"signal {signum} is not a valid signal number")
        if self.status is None and self.pid:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.pid, signum)

    def resize(self, size: pb.PtySize) -> None:
        rows, cols = check_pty_size(size)
        if not self.pty:
            raise precondition(f"process {self.process_id} has no terminal", "PROCESS_STATE")
        if self._master is None or self.status is not None:
            raise precondition(f"process {self.process_id} is not running", "PROCESS_STATE")
        with contextlib.suppress(OSError):
            fcntl.ioctl(self._master, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))

    def info(self) -> pb.ProcessInfo:
        with self.changed:
            info = pb.ProcessInfo(
                sandbox_id=self.sandbox_id,
                process_id=self.process_id,
                argv=list(self.argv),
                started_at=self.started_at,
                state="running" if self.status is None else "exited",
                pty=self.pty,
                pid=self.pid,
                output_bytes=self.end,
                dropped_bytes=self.start,
            )
            if self.status is not None:
                info.status.CopyFrom(self.status)
        return info

    def events(self, offset: int, from_now: bool) -> Iterator[pb.ProcessEvent]:
        with self.changed:
            if offset > self.end and not from_now:
                raise invalid(f"offset {offset} is past the output's end ({self.end})")
            offset = self.end if from_now else offset
        while True:
            with self.changed:
                dropped, chunks = self.read_from(offset)
                done = self.status is not None
                if not dropped and not chunks and not done:
                    self.changed.wait(0.5)
                    continue
            if dropped:
                offset += dropped
                yield pb.ProcessEvent(dropped=dropped, offset=offset)
            for start, stream, data in chunks:
                offset = start + len(data)
                if stream == STDOUT:
                    yield pb.ProcessEvent(stdout=data, offset=offset)
                else:
                    yield pb.ProcessEvent(stderr=data, offset=offset)
            if done and offset >= self.end:
                yield pb.ProcessEvent(exit=self.status, offset=offset)
                return

    def wait(self, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        with self.changed:
            while self.status is None and (left := deadline - time.monotonic()) > 0:
                self.changed.wait(left)

    def kill(self) -> None:
        self.signal(9)


def _take_terminal() -> None:
    """In the child (a new session): make fd 0, the slave, its controlling terminal."""
    fcntl.ioctl(0, termios.TIOCSCTTY, 0)


class FakeProcesses:
    """One sandbox's background processes, live and recently finished."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._all: dict[str, FakeProcess] = {}

    def add(self, process: FakeProcess) -> None:
        with self._lock:
            live = [p for p in self._all.values() if p.status is None]
            if len(live) >= MAX_LIVE:
                raise Refusal(
                    grpc.StatusCode.RESOURCE_EXHAUSTED,
                    "QUOTA_EXCEEDED",
                    f"no more background processes: this sandbox has {MAX_LIVE}",
                )
            finished = sorted(
                (p for p in self._all.values() if p.status is not None), key=lambda p: p.ended_at
            )
            for old in finished[: max(0, len(finished) - KEEP_FINISHED + 1)]:
                del self._all[old.process_id]
            self._all[process.process_id] = process

    def get(self, sandbox_id: str, process_id: str) -> FakeProcess:
        with self._lock:
            process = self._all.get(process_id)
        if process is None:
            raise not_found(
                f"process {process_id[:80]!r} does not exist in sandbox {sandbox_id}",
                "PROCESS_NOT_FOUND",
            )
        return process

    def list(self) -> list[FakeProcess]:
        with self._lock:
            return sorted(self._all.values(), key=lambda p: p.started_at)

    def kill_all(self) -> None:
        for process in self.list():
            process.kill()
