"""The fake's ConnectPort: a sandbox's port is whatever local address the test maps it to.

A fake sandbox has no network namespace of its own (its commands, when it runs
them, are host processes), so "port 8000 inside the sandbox" cannot mean the
host's port 8000 without letting every fake sandbox reach every local
service. A test says where each port leads with
``FakeOrchard.map_port(sandbox_id, port, ("127.0.0.1", real_port))``; an
unmapped port is refused exactly as the real executor refuses a port nothing
listens on (FAILED_PRECONDITION / PORT_NOT_LISTENING). The request checks and
the stream's shape (``opened``, ``data`` both ways, half-close, ``eof``)
follow ``services/executor/ports.py``.
"""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Iterator

import grpc

from orchard._proto.orchard.v1 import executor_pb2 as pb

from ._status import Refusal, invalid

CHUNK_BYTES = 256 * 1024
LOOPBACK = {"", "127.0.0.1", "::1"}


def _refused(message: str) -> Refusal:
    return Refusal(grpc.StatusCode.FAILED_PRECONDITION, "PORT_NOT_LISTENING", message)


def check_open(target: pb.PortOpen) -> None:
    if not 1 <= target.port <= 65535:
        raise invalid(f"port must be 1..65535, got {target.port}")
    if target.host not in LOOPBACK:
        raise invalid(
            f"host {target.host[:80]!r} is not the sandbox's loopback: only '127.0.0.1' "
            "(or '') and '::1' can be reached through a port forward"
        )


def relay(
    target: tuple[str, int] | None, port: int, requests: Iterator[pb.PortRequest]
) -> Iterator[pb.PortEvent]:
    """Connect to the mapped address and carry bytes both ways until both ends close."""
    if target is None:
        raise _refused(
            f"nothing listens on 127.0.0.1:{port} inside the fake sandbox "
            "(map it with FakeOrchard.map_port)"
        )
    try:
        sock = socket.create_connection(target, timeout=10)
    except OSError as exc:
        raise _refused(f"could not connect to port {port} of the fake sandbox: {exc}") from None
    sock.settimeout(None)
    failure: list[Refusal] = []

    def upstream() -> None:
        try:
            for request in requests:
                if request.WhichOneof("kind") != "data":
                    raise invalid("only the first PortRequest may be `open`; then only `data`")
                sock.sendall(request.data)
            sock.shutdown(socket.SHUT_WR)
        except Refusal as exc:
            failure.append(exc)
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
        except Exception:  # the client's stream broke or the peer went: end both ways
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)

    pump = threading.Thread(target=upstream, name="fake-port", daemon=True)
    try:
        yield pb.PortEvent(opened=pb.PortOpened(address=f"127.0.0.1:{port}"))
        pump.start()
        while data := sock.recv(CHUNK_BYTES):
            yield pb.PortEvent(data=data)
        yield pb.PortEvent(eof=True)
        pump.join()
        if failure:
            raise failure[0]
    finally:
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)
        sock.close()
