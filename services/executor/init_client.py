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

from .init_protocol import (
    ERROR_SIZE,
    EXIT_SIZE,
    KILL_TREE,
    STARTED_SIZE,
    ExitReport,
    InitRequest,
    ProtocolError,
    StartFailure,
    decode_error,
    decode_exit,
    decode_pid,
    encode_request,
    encode_signal,
)


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
        self.stdin_fd: int | None = next(it) if request.stdin else None
        self.stdout_fd: int | None = next(it)
        self.stderr_fd: int | None = next(it)
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
        for name in ("stdin_fd", "stdout_fd", "stderr_fd", "status_fd", "control_fd"):
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
    payload = encode_request(request)
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
    conn.setblocking(False)
    try:
        try:
            conn.connect(socket_path)
        except BlockingIOError:
            # The listen backlog is full: wait for init to accept.
            await loop.sock_connect(conn, socket_path)
        sent = conn.send(payload)
        if sent < len(payload):
            await loop.sock_sendall(conn, payload[sent:])
        return await _read_start_answer(loop, conn, request)
    except (FileNotFoundError, ConnectionRefusedError) as exc:
        conn.close()
        raise InitUnavailable(f"orchard-init is not listening at {socket_path}: {exc}") from exc
    except OSError as exc:
        conn.close()
        raise InitUnavailable(f"talking to orchard-init failed: {exc}") from exc
    except BaseException:
        conn.close()
        raise


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
