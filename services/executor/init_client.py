"""The asyncio client of orchard-init: start one command per connection.

Everything here runs on the event loop with non-blocking sockets and
``loop.add_reader`` (no threads, no per-call work that grows with the number
of sandboxes), so it works the same on asyncio's loop and on uvloop. A
connection is one command: :func:`start_command` connects to the sandbox's
``init.sock``, sends the request, and returns an :class:`InitCommand` holding
the pipes the shim passed back and a future for the final ``'X'`` report.
Closing the connection makes the shim kill the command's whole tree, so a
client that goes away never leaves a command behind.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
from dataclasses import dataclass

from .init_protocol import (
    DATA_HEADER_SIZE,
    ERROR_SIZE,
    EXIT_SIZE,
    KILL_ALL_SIZE,
    KILL_TREE,
    STARTED_SIZE,
    STDERR,
    STDOUT,
    ExitReport,
    InitRequest,
    ProtocolError,
    StartFailure,
    decode_error,
    decode_exit,
    decode_kill_all,
    decode_pid,
    encode_request,
    encode_signal,
)
from .output_budget import OutputCharge
from .pipes import CappedOutput


class InitUnavailable(Exception):
    """orchard-init could not be reached or hung up before answering."""


class InitCommand:
    """A running command: its pipes (non-blocking fds) and its shim connection.

    The fds belong to this object until :meth:`take_fd` hands one over; the
    ones still held are closed by :meth:`close`.
    """

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        conn: socket.socket,
        pid: int,
        fds: list[int],
        request: InitRequest,
        pending: bytes,
    ) -> None:
        self._loop = loop
        self._conn = conn
        self.pid = pid
        it = iter(fds)
        self.pty_fd: int | None = next(it) if request.pty is not None else None
        self.stdin_fd: int | None = next(it) if request.stdin else None
        self.stdout_fd: int | None = next(it) if request.pty is None else None
        self.stderr_fd: int | None = next(it) if request.pty is None else None
        self.status_fd: int | None = next(it) if request.session_fds else None
        self.control_fd: int | None = next(it) if request.session_fds else None
        for fd in fds:
            os.set_blocking(fd, False)
        self.exited: asyncio.Future[ExitReport] = loop.create_future()
        self._inbox = bytearray(pending)
        self._reading = False
        if not self._check_inbox():
            loop.add_reader(conn.fileno(), self._on_conn_readable)
            self._reading = True

    def _check_inbox(self) -> bool:
        if len(self._inbox) < EXIT_SIZE:
            return False
        if not self.exited.done():
            try:
                self.exited.set_result(decode_exit(bytes(self._inbox[:EXIT_SIZE])))
            except ProtocolError as exc:
                self.exited.set_exception(InitUnavailable(str(exc)))
        return True

    def _on_conn_readable(self) -> None:
        try:
            data = self._conn.recv(64)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:
            data = b""
            error: str = str(exc)
        else:
            error = "orchard-init closed the connection before the command's exit report"
        if data:
            self._inbox += data
            if not self._check_inbox():
                return
        elif not self.exited.done():
            self.exited.set_exception(InitUnavailable(error))
        self._stop_reading()

    def _stop_reading(self) -> None:
        if self._reading:
            self._reading = False
            self._loop.remove_reader(self._conn.fileno())

    def signal(self, signum: int) -> None:
        """Send ``signum`` to the command's process group (no-op once it exited)."""
        self._send(encode_signal(signum))

    def kill_tree(self) -> None:
        """SIGKILL the command and every descendant."""
        self._send(KILL_TREE)

    def _send(self, message: bytes) -> None:
        if self.exited.done() or self._conn.fileno() < 0:
            return
        # Tiny messages on a socket nobody else writes: they never block.
        with contextlib.suppress(OSError):
            self._conn.send(message)

    def take_fd(self, name: str) -> int:
        """Hand over ownership of one fd (``stdout_fd``, ``stdin_fd``, ...)."""
        fd = getattr(self, name)
        if fd is None:
            raise ValueError(f"{name} is not open")
        setattr(self, name, None)
        return int(fd)

    def close(self) -> None:
        """Close every fd still held and the connection (kills a live tree)."""
        self._stop_reading()
        for name in ("pty_fd", "stdin_fd", "stdout_fd", "stderr_fd", "status_fd", "control_fd"):
            fd = getattr(self, name)
            if fd is not None:
                setattr(self, name, None)
                with contextlib.suppress(OSError):
                    os.close(fd)
        self._conn.close()
        if not self.exited.done():
            self.exited.set_exception(InitUnavailable("closed before the command exited"))
            # Nobody may await it any more; do not log "exception never retrieved".
            self.exited.exception()


async def start_command(socket_path: str, request: InitRequest) -> InitCommand | StartFailure:
    """Ask the orchard-init at ``socket_path`` to start ``request``.

    Returns the running command, or the init's :class:`StartFailure` when the
    command could not start (chdir, credentials, execve). Raises
    :class:`InitUnavailable` if init cannot be reached.
    """
    loop = asyncio.get_running_loop()
    conn = await _send_request(loop, socket_path, request)
    try:
        return await _read_start_answer(loop, conn, request)
    except OSError as exc:
        conn.close()
        raise InitUnavailable(f"talking to orchard-init failed: {exc}") from exc
    except BaseException:
        conn.close()
        raise


MAX_UNIX_PATH = 107
"""The longest path ``connect`` takes for an AF_UNIX socket (sun_path is 108 bytes)."""


async def _send_request(
    loop: asyncio.AbstractEventLoop, socket_path: str, request: InitRequest
) -> socket.socket:
    """A connection to init with the whole request sent (non-blocking socket)."""
    payload = encode_request(request)
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
    conn.setblocking(False)
    folder_fd = -1
    try:
        address = socket_path
        if len(os.fsencode(socket_path)) > MAX_UNIX_PATH:
            # A deep home (a long ORCHARD_HOME, a test's tmp folder): the kernel takes at
            # most 107 bytes of path, so reach the socket through an fd of its folder.
            folder, name = os.path.split(socket_path)
            folder_fd = os.open(folder, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
            address = f"/proc/self/fd/{folder_fd}/{name}"
        try:
            conn.connect(address)
        except BlockingIOError:
            # The listen backlog is full: wait for init to accept.
            await loop.sock_connect(conn, address)
        sent = conn.send(payload)
        if sent < len(payload):
            await loop.sock_sendall(conn, payload[sent:])
        return conn
    except (FileNotFoundError, ConnectionRefusedError) as exc:
        conn.close()
        raise InitUnavailable(f"orchard-init is not listening at {socket_path}: {exc}") from exc
    except OSError as exc:
        conn.close()
        raise InitUnavailable(f"talking to orchard-init failed: {exc}") from exc
    except BaseException:
        conn.close()
        raise
    finally:
        if folder_fd >= 0:
            os.close(folder_fd)


async def kill_all(socket_path: str, request: InitRequest) -> int | StartFailure:
    """Send a kill-all request (:func:`init_protocol.kill_all_request`); the
    number of processes signalled, or init's refusal."""
    if not request.kill_all:
        raise ValueError("kill_all needs a kill-all request")
    loop = asyncio.get_running_loop()
    conn = await _send_request(loop, socket_path, request)
    try:
        answer = bytearray()
        while len(answer) < max(KILL_ALL_SIZE, ERROR_SIZE):
            data = await loop.sock_recv(conn, max(KILL_ALL_SIZE, ERROR_SIZE) - len(answer))
            if not data:
                break
            answer += data
            if answer[:1] == b"A" and len(answer) >= KILL_ALL_SIZE:
                return decode_kill_all(bytes(answer[:KILL_ALL_SIZE]))
        if answer[:1] == b"E" and len(answer) >= ERROR_SIZE:
            return decode_error(bytes(answer[:ERROR_SIZE]))
        raise InitUnavailable(f"orchard-init answered a kill-all with {bytes(answer)!r}")
    except ProtocolError as exc:
        raise InitUnavailable(f"orchard-init answered badly: {exc}") from exc
    except OSError as exc:
        raise InitUnavailable(f"talking to orchard-init failed: {exc}") from exc
    finally:
        conn.close()


# ------------------------------------------------------------ inline output


@dataclass(frozen=True, slots=True)
class InlineOutcome:
    """A finished inline-output command: its exit report and its capped output."""

    report: ExitReport
    stdout: CappedOutput
    stderr: CappedOutput


async def run_inline(
    socket_path: str, request: InitRequest, limit: int, charge: OutputCharge | None = None
) -> InlineOutcome | StartFailure:
    """Run ``request`` with inline output (no stdin) to completion.

    The shim forwards stdout and stderr as 'D' frames and ends with 'X' (or
    answers 'E'), so the whole exec is one socket and, for a short command,
    one wake-up. Each stream keeps at most ``limit`` bytes; the rest is read
    and dropped, so the command never blocks on output. Cancelling (the
    caller went away) closes the connection, which kills the command's tree.
    """
    if not request.inline_output:
        raise ValueError("run_inline needs a request with inline_output")
    loop = asyncio.get_running_loop()
    conn = await _send_request(loop, socket_path, request)
    reader = _InlineReader(loop, conn, limit, charge)
    try:
        return await reader.done
    finally:
        reader.close()


# Largest 'D' frame accepted; the shim sends at most 64 KiB per frame.
MAX_DATA_FRAME = 1 << 20
INLINE_RECV_SIZE = 256 * 1024
# Reads per readiness callback, bounded so one flooding command cannot starve the loop.
INLINE_READS_PER_WAKEUP = 1


class _InlineReader:
    """Reads the 'D'/'X'/'E' stream of one inline-output command."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        conn: socket.socket,
        limit: int,
        charge: OutputCharge | None,
    ) -> None:
        self._loop = loop
        self._conn = conn
        self._fd = conn.fileno()
        self._buffer = bytearray()
        self._outputs = {STDOUT: CappedOutput(limit, charge), STDERR: CappedOutput(limit, charge)}
        self._charge = charge
        self._resume: asyncio.TimerHandle | None = None
        self.done: asyncio.Future[InlineOutcome | StartFailure] = loop.create_future()
        loop.add_reader(self._fd, self._on_readable)
        self._reading = True

    def _on_readable(self) -> None:
        if self._charge is not None and (pause := self._charge.pause_seconds()) > 0:
            # The tenant is past its output pace: leave the socket unread a moment.
            self._stop_reading()
            self._resume = self._loop.call_later(pause, self._read_again)
            return
        for _ in range(INLINE_READS_PER_WAKEUP):
            try:
                data = self._conn.recv(INLINE_RECV_SIZE)
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                self._fail(f"talking to orchard-init failed: {exc}")
                return
            if not data:
                self._fail("orchard-init closed the connection before the command's exit report")
                return
            if self._charge is not None:
                self._charge.read(len(data))
            self._buffer += data
            try:
                if self._parse():
                    return
            except ProtocolError as exc:
                self._fail(f"orchard-init answered badly: {exc}")
                return
            if len(data) < INLINE_RECV_SIZE:
                return

    def _parse(self) -> bool:
        """Consume whole frames; True once the final 'X' or 'E' has arrived."""
        buffer = self._buffer
        pos = 0
        try:
            while len(buffer) - pos >= 1:
                kind = buffer[pos]
                if kind == 0x44:  # 'D'
                    if len(buffer) - pos < DATA_HEADER_SIZE:
                        return False
                    stream = buffer[pos + 1]
                    length = int.from_bytes(buffer[pos + 2 : pos + 6], "little")
                    if stream not in self._outputs or length > MAX_DATA_FRAME:
                        raise ProtocolError(f"bad data frame (stream {stream}, {length} bytes)")
                    end = pos + DATA_HEADER_SIZE + length
                    if len(buffer) < end:
                        return False
                    self._outputs[stream].append(bytes(buffer[pos + DATA_HEADER_SIZE : end]))
                    pos = end
                elif kind == 0x58:  # 'X'
                    if len(buffer) - pos < EXIT_SIZE:
                        return False
                    report = decode_exit(bytes(buffer[pos : pos + EXIT_SIZE]))
                    self._finish(
                        InlineOutcome(report, self._outputs[STDOUT], self._outputs[STDERR])
                    )
                    return True
                elif kind == 0x45:  # 'E'
                    if len(buffer) - pos < ERROR_SIZE:
                        return False
                    self._finish(decode_error(bytes(buffer[pos : pos + ERROR_SIZE])))
                    return True
                else:
                    raise ProtocolError(f"unexpected message kind {kind:#x}")
            return False
        finally:
            del buffer[:pos]

    def _finish(self, result: InlineOutcome | StartFailure) -> None:
        self._stop_reading()
        if not self.done.done():
            self.done.set_result(result)

    def _fail(self, message: str) -> None:
        self._stop_reading()
        if not self.done.done():
            self.done.set_exception(InitUnavailable(message))

    def _stop_reading(self) -> None:
        if self._reading:
            self._reading = False
            self._loop.remove_reader(self._fd)

    def _read_again(self) -> None:
        self._resume = None
        if not self._reading and not self.done.done() and self._conn.fileno() >= 0:
            self._reading = True
            self._loop.add_reader(self._fd, self._on_readable)

    def close(self) -> None:
        """Stop reading and close the connection (kills a tree still running)."""
        if self._resume is not None:
            self._resume.cancel()
            self._resume = None
        self._stop_reading()
        self._conn.close()


async def _read_start_answer(
    loop: asyncio.AbstractEventLoop, conn: socket.socket, request: InitRequest
) -> InitCommand | StartFailure:
    """Wait for 'S' (with fds) or 'E'; the fds arrive with the first byte."""
    max_fds = request.fd_count
    buffer = bytearray()
    fds: list[int] = []
    fut: asyncio.Future[None] | None = None
    try:
        while True:
            try:
                data, got_fds, _flags, _addr = socket.recv_fds(
                    conn, max(STARTED_SIZE, ERROR_SIZE) - len(buffer), max_fds
                )
            except (BlockingIOError, InterruptedError):
                fut = loop.create_future()
                loop.add_reader(conn.fileno(), _wake, fut)
                try:
                    await fut
                finally:
                    loop.remove_reader(conn.fileno())
                continue
            fds.extend(got_fds)
            if not data:
                raise InitUnavailable("orchard-init closed the connection without answering")
            buffer += data
            kind = bytes(buffer[:1])
            if kind == b"S" and len(buffer) >= STARTED_SIZE:
                if len(fds) != max_fds:
                    raise ProtocolError(f"expected {max_fds} fds, got {len(fds)}")
                pid = decode_pid(bytes(buffer[:STARTED_SIZE]))
                command = InitCommand(loop, conn, pid, fds, request, bytes(buffer[STARTED_SIZE:]))
                fds = []
                return command
            if kind == b"E" and len(buffer) >= ERROR_SIZE:
                conn.close()
                return decode_error(bytes(buffer[:ERROR_SIZE]))
            if kind not in (b"S", b"E"):
                raise ProtocolError(f"unexpected answer {bytes(buffer)!r}")
    except ProtocolError as exc:
        raise InitUnavailable(f"orchard-init answered badly: {exc}") from exc
    finally:
        for fd in fds:
            os.close(fd)


def _wake(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)
