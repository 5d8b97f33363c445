"""The asyncio face of ports: tasks relaying local streams over grpc.aio ConnectPort calls.

Each forwarded connection is one grpc.aio bidirectional call and two tasks:
local -> sandbox (``reader.read`` then ``call.write``, which waits for gRPC's
flow control) and sandbox -> local (``call.read`` then ``writer.drain``,
which waits for the local peer). Nothing is queued in between. See
:mod:`._ports` for the design and the two calls.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Awaitable, Callable
from types import TracebackType
from typing import TYPE_CHECKING, Any, Self

import grpc

from orchard._proto.orchard.v1 import executor_pb2, executor_pb2_grpc

from ._core import ExecutorAccess, translate_errors
from ._errors import InfrastructureError, OrchardError
from ._ports import (
    CHUNK_BYTES,
    PortForwardBase,
    data_request,
    linger_zero,
    local_listener,
    open_request,
)

if TYPE_CHECKING:
    AsyncDial = Callable[
        [], Awaitable[tuple[executor_pb2_grpc.ExecutorServiceAsyncStub, ExecutorAccess]]
    ]
_EOF = grpc.aio.EOF  # type: ignore[attr-defined]  # missing from grpc's type stubs
# Relays of connect_port() sockets, kept here so their tasks are not collected.
_RUNNING: set[asyncio.Task[Any]] = set()


async def _open(dial: AsyncDial, first: executor_pb2.PortRequest) -> Any:
    """The call, once the executor said ``opened`` (errors raised as OrchardError)."""
    stub, access = await dial()
    # No request iterator: the relay writes with call.write (the stubs' types want one).
    call = stub.ConnectPort(metadata=access.metadata)  # type: ignore[call-arg]
    try:
        with translate_errors():
            await call.write(first)
            event: Any = await call.read()
    except BaseException:
        call.cancel()
        raise
    if event is _EOF or event.WhichOneof("kind") != "opened":
        call.cancel()
        raise InfrastructureError("the executor did not answer ConnectPort with `opened`")
    return call


async def _upstream(call: Any, reader: asyncio.StreamReader) -> None:
    while data := await reader.read(CHUNK_BYTES):
        await call.write(data_request(data))
    await call.done_writing()


async def _downstream(call: Any, writer: asyncio.StreamWriter) -> None:
    with translate_errors():
        while (event := await call.read()) is not _EOF:
            kind = event.WhichOneof("kind")
            if kind == "data":
                writer.write(event.data)
                await writer.drain()
            elif kind == "eof" and writer.can_write_eof():
                writer.write_eof()


async def _relay(
    call: Any, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
) -> OrchardError | None:
    """Bytes both ways until the call ends; then close the local side (a reset on
    failure). Returns the call's error, if it failed."""
    down = asyncio.create_task(_downstream(call, writer))
    up = asyncio.create_task(_upstream(call, reader))
    error: OrchardError | None = None
    failed = False
    try:
        await asyncio.wait({down, up}, return_when=asyncio.FIRST_EXCEPTION)
        if up.done() and not up.cancelled() and up.exception() is not None:
            failed = True  # the local peer reset or the call broke while writing
        if not failed:
            await down
    except OrchardError as exc:
        error, failed = exc, True
    except OSError:
        failed = True
    finally:
        for task in (down, up):
            task.cancel()
        call.cancel()
        sock = writer.get_extra_info("socket")
        if failed and sock is not None:
            linger_zero(sock)
        writer.close()
        await asyncio.gather(down, up, return_exceptions=True)
    return error


async def connect_port(dial: AsyncDial, sandbox_id: str, port: int, host: str) -> socket.socket:
    """One connection to ``port`` inside the sandbox, as a connected local socket."""
    call = await _open(dial, open_request(sandbox_id, port, host))
    ours, theirs = socket.socketpair()
    try:
        reader, writer = await asyncio.open_connection(sock=ours)
    except BaseException:
        call.cancel()
        ours.close()
        theirs.close()
        raise
    task = asyncio.create_task(_relay(call, reader, writer))
    _RUNNING.add(task)
    task.add_done_callback(_RUNNING.discard)
    return theirs


class AsyncPortForward(PortForwardBase):
    """A listener on 127.0.0.1 forwarding each connection to a port inside the sandbox.

    Made by ``await AsyncSandbox.forward_port(...)``; an async context manager
    (``close`` on exit). Its connections are served on the loop that made it.
    """

    def __init__(
        self, dial: AsyncDial, sandbox_id: str, port: int, host: str, local_port: int = 0
    ) -> None:
        open_request(sandbox_id, port, host)  # the same checks as each connection's
        self._listener = local_listener(local_port)
        super().__init__(sandbox_id, port, host, self._listener.getsockname()[:2])
        self._dial = dial
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        self._closing = False

    async def _start(self) -> Self:
        self._server = await asyncio.start_server(self._serve, sock=self._listener)
        return self

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            await self._serve_one(reader, writer)
        except asyncio.CancelledError:
            # close() cancels the connections still open: end quietly. Python 3.11's
            # start_server reads a handler task that ends cancelled as an error and logs
            # "Exception in callback ... connection_made" for every such connection.
            if not self._closing:
                raise

    async def _serve_one(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        if task is not None:
            self._tasks.add(task)
        self.accepted += 1
        self.connections += 1
        try:
            try:
                call = await _open(self._dial, open_request(self.sandbox_id, self.port, self.host))
            except OrchardError as exc:
                self._failed(exc)
                return
            error = await _relay(call, reader, writer)
            if error is not None:
                self._failed(error)
        finally:
            if not writer.is_closing():  # refused, cancelled by close(), or broken: a reset
                sock = writer.get_extra_info("socket")
                if sock is not None:
                    linger_zero(sock)
                writer.close()
            self.connections -= 1
            if task is not None:
                self._tasks.discard(task)

    async def close(self) -> None:
        """Stop listening and reset the connections still open."""
        self._closing = True
        if self._server is not None:
            self._server.close()
        else:
            self._listener.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()
