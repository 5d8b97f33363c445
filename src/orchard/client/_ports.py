"""Ports: reach a TCP port inside a sandbox from this machine, without publishing it.

Two calls on both faces (``Sandbox`` / ``AsyncSandbox``):

- ``forward_port(port)``: a listener on ``127.0.0.1`` (an ephemeral port unless
  ``local_port`` is given); every connection to it is one ``ConnectPort`` stream
  to ``port`` on the sandbox's loopback. Many at once. ``.url`` is
  ``http://127.0.0.1:NNNN`` and ``.local_address`` the (host, port) pair, for a
  browser, an HTTP client or a WebSocket library. A context manager: leaving it
  stops the listener and resets the connections still open.
- ``connect_port(port)``: one connection, made (or refused) before it returns,
  as a plain connected ``socket.socket`` (one end of a Unix socket pair whose
  other end the SDK relays), for code that wants a stream and no listener.

Beside the anchors: E2B's ``get_host(port)`` and Modal's ``forward(port)`` hand
out public URLs (reachable by anyone who learns them unless extra auth is set
up) and Modal's ports must be declared at creation. Here nothing is published:
the listener is on this machine's loopback, every connection is authorised by
the sandbox's data-plane token, any port works at any time, and the sandbox's
network policy (``none`` included) is neither needed nor changed. The names
follow the socket vocabulary: ``connect`` makes one connection
(``socket.create_connection``), ``forward`` keeps a listener (``ssh -L``,
``kubectl port-forward``, ``modal.forward``).

A forwarded connection that the sandbox refuses (nothing listens) is closed
with a reset, logged on the ``orchard.ports`` logger and kept as
``forward.last_error``; ``connect_port`` raises it (``PortNotListeningError``,
also a ``ConnectionRefusedError``). This module holds what both faces share:
the checks, the request, and the handle's addresses.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import struct
from typing import Any

from orchard._proto.orchard.v1 import executor_pb2

from ._errors import InvalidRequestError, OrchardError

log = logging.getLogger("orchard.ports")

CHUNK_BYTES = 256 * 1024
LOCAL_HOST = "127.0.0.1"
MAX_PORT = 65535
LOOPBACK_HOSTS = {"127.0.0.1": "127.0.0.1", "localhost": "127.0.0.1", "": "127.0.0.1", "::1": "::1"}


def check_port(port: int, what: str = "port", allow_zero: bool = False) -> int:
    if isinstance(port, bool) or not isinstance(port, int):
        raise InvalidRequestError(f"{what} must be an int, got {type(port).__name__}")
    low = 0 if allow_zero else 1
    if not low <= port <= MAX_PORT:
        raise InvalidRequestError(f"{what} must be {low}..{MAX_PORT}, got {port}")
    return port


def check_host(host: str) -> str:
    """The sandbox loopback address to dial: only ``127.0.0.1`` and ``::1`` exist for a
    forward (``localhost`` is ``127.0.0.1``); the executor refuses anything else too."""
    address = LOOPBACK_HOSTS.get(host)
    if address is None:
        raise InvalidRequestError(
            f"host {host[:80]!r} is not the sandbox's loopback: a forward reaches only "
            "'127.0.0.1' (or 'localhost') and '::1' inside the sandbox"
        )
    return address


def open_request(sandbox_id: str, port: int, host: str) -> executor_pb2.PortRequest:
    return executor_pb2.PortRequest(
        open=executor_pb2.PortOpen(
            sandbox_id=sandbox_id, port=check_port(port), host=check_host(host)
        )
    )


def data_request(data: bytes) -> executor_pb2.PortRequest:
    return executor_pb2.PortRequest(data=data)


def linger_zero(sock: Any) -> None:
    """SO_LINGER 0 where ``sock`` is TCP, so closing it sends a reset: the local peer
    then sees a failure as a failure and not as a clean end."""
    with contextlib.suppress(OSError):
        if sock.family in (socket.AF_INET, socket.AF_INET6):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))


def reset(sock: socket.socket) -> None:
    """Close with a reset. ``shutdown(SHUT_RD)`` first wakes a thread blocked in ``recv``
    on it (a bare close would wait for that thread, and send nothing until then)."""
    linger_zero(sock)
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RD)
    sock.close()


def local_listener(local_port: int) -> socket.socket:
    """A listening socket on 127.0.0.1 (``local_port`` 0: an ephemeral port)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        if local_port:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((LOCAL_HOST, check_port(local_port, "local_port", allow_zero=True)))
        sock.listen(128)
    except OSError as exc:
        sock.close()
        raise InvalidRequestError(f"cannot listen on {LOCAL_HOST}:{local_port}: {exc}") from None
    return sock


class PortForwardBase:
    """What a forward's handle says about itself (no I/O)."""

    def __init__(self, sandbox_id: str, port: int, host: str, local_address: tuple[str, int]):
        self.sandbox_id = sandbox_id
        self.port = port
        """The port inside the sandbox."""
        self.host = host
        self.local_address = local_address
        """(host, port) of the local listener."""
        self.last_error: OrchardError | None = None
        """The last failure of a forwarded connection (e.g. nothing listens inside)."""
        self.connections = 0
        """Forwarded connections open now."""
        self.accepted = 0
        """Connections accepted since the forward started."""

    @property
    def local_port(self) -> int:
        return self.local_address[1]

    @property
    def url(self) -> str:
        """``http://127.0.0.1:NNNN``: the listener as an HTTP base URL."""
        return f"http://{self.local_address[0]}:{self.local_address[1]}"

    def _failed(self, error: OrchardError) -> None:
        self.last_error = error
        log.warning(
            "forwarded connection to port %d of sandbox %s failed: %s",
            self.port,
            self.sandbox_id,
            error,
        )

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.url} -> {self.sandbox_id}:{self.port}>"
