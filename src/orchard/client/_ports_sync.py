"""The synchronous face of ports: threads relaying local sockets over ConnectPort streams.

Each forwarded connection is one sync gRPC bidirectional call: gRPC's own
request-consumer thread pulls the request iterator (which blocks in
``recv`` on the local socket, so a silent local peer sends nothing), and one
thread of ours pulls the responses and ``sendall``\\ s them into the local
socket (so a local peer that reads slowly stops the responses, and HTTP/2
flow control stops the executor). Nothing is queued in between. See
:mod:`._ports` for the design and the two calls.
"""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Callable, Iterator
from types import TracebackType
from typing import Any, Self

from orchard._proto.orchard.v1 import executor_pb2, executor_pb2_grpc

from ._core import ExecutorAccess, translate_errors
from ._errors import InfrastructureError, OrchardError
from ._ports import (
    CHUNK_BYTES,
    PortForwardBase,
    data_request,
    local_listener,
    open_request,
    reset,
)

Dial = Callable[[], tuple[executor_pb2_grpc.ExecutorServiceStub, ExecutorAccess]]


class _Relay:
    """One local socket <-> one ConnectPort call."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.call: Any = None
        self._cancelled = threading.Event()

    def open(self, dial: Dial, first: executor_pb2.PortRequest) -> None:
        """Start the call and wait for ``opened`` (errors raised as OrchardError)."""
        stub, access = dial()
        self.call = stub.ConnectPort(self._requests(first), metadata=access.metadata)
        try:
            with translate_errors():
                event = next(self.call)
        except StopIteration:
            event = None
        except BaseException:
            self.cancel()
            raise
        if event is None or event.WhichOneof("kind") != "opened":
            self.cancel()
            raise InfrastructureError("the executor did not answer ConnectPort with `opened`")

    def _requests(self, first: executor_pb2.PortRequest) -> Iterator[executor_pb2.PortRequest]:
        yield first
        while not self._cancelled.is_set():
            try:
                data = self.sock.recv(CHUNK_BYTES)
            except OSError:  # the local peer reset: so does the connection inside
                self.cancel()
                return
            if not data:  # local half-close: end the request stream (SHUT_WR inside)
                return
            yield data_request(data)

    def cancel(self) -> None:
        self._cancelled.set()
        if self.call is not None:
            self.call.cancel()

    def run(self) -> OrchardError | None:
        """Responses into the local socket until the call ends; then close the socket
        (a reset on failure). Returns the call's error, if it failed."""
        error: OrchardError | None = None
        try:
            with translate_errors():
                for event in self.call:
                    kind = event.WhichOneof("kind")
                    if kind == "data":
                        self.sock.sendall(event.data)
                    elif kind == "eof":
                        self.sock.shutdown(socket.SHUT_WR)
        except OrchardError as exc:
            error = None if self._cancelled.is_set() else exc
        except OSError:  # the local peer went away while we wrote
            pass
        failed = error is not None or self._cancelled.is_set()
        self.cancel()
        if failed:
            reset(self.sock)
        else:
            with contextlib.suppress(OSError):
                self.sock.shutdown(socket.SHUT_RD)  # wakes the request thread's recv
            self.sock.close()
        return error


def connect_port(dial: Dial, sandbox_id: str, port: int, host: str) -> socket.socket:
    """One connection to ``port`` inside the sandbox, as a connected local socket."""
    first = open_request(sandbox_id, port, host)
    ours, theirs = socket.socketpair()
    relay = _Relay(ours)
    try:
        relay.open(dial, first)
    except BaseException:
        ours.close()
        theirs.close()
        raise
    threading.Thread(target=relay.run, name=f"orchard-port-{port}", daemon=True).start()
    return theirs


class PortForward(PortForwardBase):
    """A listener on 127.0.0.1 forwarding each connection to a port inside the sandbox.

    Made by :meth:`Sandbox.forward_port`; a context manager (``close`` on exit).
    """

    def __init__(
        self, dial: Dial, sandbox_id: str, port: int, host: str, local_port: int = 0
    ) -> None:
        open_request(sandbox_id, port, host)  # the same checks as each connection's
        self._listener = local_listener(local_port)
        super().__init__(sandbox_id, port, host, self._listener.getsockname()[:2])
        self._dial = dial
        self._lock = threading.Lock()
        self._relays: set[_Relay] = set()
        self._closed = False
        self._thread = threading.Thread(
            target=self._accept, name=f"orchard-forward-{port}", daemon=True
        )

    def _start(self) -> Self:
        self._thread.start()
        return self

    def _accept(self) -> None:
        while True:
            try:
                sock, _ = self._listener.accept()
            except OSError:
                return  # closed
            relay = _Relay(sock)
            with self._lock:
                if self._closed:
                    reset(sock)
                    return
                self._relays.add(relay)
                self.accepted += 1
                self.connections += 1
            threading.Thread(
                target=self._serve, args=(relay,), name=f"orchard-forward-{self.port}", daemon=True
            ).start()

    def _serve(self, relay: _Relay) -> None:
        try:
            relay.open(self._dial, open_request(self.sandbox_id, self.port, self.host))
        except OrchardError as exc:
            self._failed(exc)
            reset(relay.sock)
        else:
            error = relay.run()
            if error is not None:
                self._failed(error)
        finally:
            with self._lock:
                self._relays.discard(relay)
                self.connections -= 1

    def close(self) -> None:
        """Stop listening and reset the connections still open."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            relays = list(self._relays)
        with contextlib.suppress(OSError):
            self._listener.shutdown(socket.SHUT_RDWR)
        self._listener.close()
        for relay in relays:
            relay.cancel()
        self._thread.join(timeout=5)

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
