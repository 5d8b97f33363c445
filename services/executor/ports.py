"""ConnectPort: one TCP connection into a sandbox, carried over the data plane.

Why through the executor and not a published port: E2B's ``get_host(port)``
and Modal's ``forward(port)`` give every port a public URL (anyone who learns
it can connect unless extra auth is switched on), and Modal wants its ports
declared at creation. Here a connection is one ``ConnectPort`` stream,
authorised by the sandbox's token like every other data-plane call, to any
port the sandbox listens on at any time; nothing is published, no network
policy is opened (the socket lives in the sandbox's namespace and dials only
its loopback, :mod:`port_dial`), and it works for sandboxes with policy
``none``. The SDK turns streams into a local listener (``Sandbox.forward_port``)
or a single socket (``Sandbox.connect_port``).

One stream carries one connection, so gRPC's per-stream flow control is the
connection's: the executor reads a chunk from the sandbox only when the last
one was handed to gRPC, and reads the next request only when the last chunk
was written into the sandbox's socket. Nothing queues beyond one chunk each
way, whatever the two ends do.

Half-close both ways: the client ending its request stream becomes
``shutdown(SHUT_WR)`` inside; the peer inside closing its side becomes an
``eof`` event; the call ends OK when both are done. A reset inside ends the
call with ABORTED (the SDK resets the local connection); a refused connect is
FAILED_PRECONDITION / PORT_NOT_LISTENING.

Each open connection holds one unit of the ``port connections`` share
(:mod:`shares`: per sandbox, per tenant, per node), so a client opening
thousands of streams is refused with RESOURCE_EXHAUSTED at its own share and
leaves the others theirs.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator, Iterator

import grpc

from orchard._proto.orchard.v1 import executor_pb2 as pb
from orchard.common.errors import ServiceError, invalid

from .port_dial import PortDialer, check_target, shown
from .sandboxes import Sandbox
from .shares import Owner, ShareLedger, ShareLimits
from .stream_bounds import StreamPace

CHUNK_BYTES = 256 * 1024
CONNECT_SECONDS = 10.0


class PortConnections:
    """The live forwarded connections of this executor, counted per owner."""

    def __init__(
        self, dialer: PortDialer, limits: ShareLimits, connect_seconds: float = CONNECT_SECONDS
    ) -> None:
        self._dialer = dialer
        self._shares = ShareLedger(limits, "port connections")
        self._connect_seconds = connect_seconds

    @property
    def total(self) -> int:
        return self._shares.total

    @contextlib.contextmanager
    def _hold(self, owner: Owner) -> Iterator[None]:
        refusal = self._shares.refusal(owner, 1)
        if refusal is not None:
            raise ServiceError(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                "QUOTA_EXCEEDED",
                f"too many forwarded connections: {refusal}; close some first",
                retry_after=1.0,
            )
        self._shares.add(owner, 1)
        try:
            yield
        finally:
            self._shares.remove(owner, 1)

    async def relay(
        self,
        sandbox: Sandbox,
        owner: Owner,
        target: pb.PortOpen,
        requests: AsyncIterator[pb.PortRequest],
        pace: StreamPace,
    ) -> AsyncIterator[pb.PortEvent]:
        """Dial ``target`` in the sandbox, then carry bytes both ways until both ends close."""
        family, address = check_target(target.host, target.port)
        with self._hold(owner):
            sock = await self._dialer.dial(sandbox, family, address, self._connect_seconds)
            upstream: asyncio.Task[None] | None = None
            try:
                yield pb.PortEvent(opened=pb.PortOpened(address=shown(address)))
                failure: list[BaseException] = []
                upstream = asyncio.create_task(_into_sandbox(requests, sock, pace, failure))
                async for event in _out_of_sandbox(sock):
                    yield event
                await upstream
                if failure:
                    raise failure[0]
            finally:
                if upstream is not None:
                    upstream.cancel()
                sock.close()


async def _into_sandbox(
    requests: AsyncIterator[pb.PortRequest],
    sock: socket.socket,
    pace: StreamPace,
    failure: list[BaseException],
) -> None:
    """Client -> sandbox; the end of the request stream half-closes the socket.

    On a failure (a bad message, a reset inside) the failure is recorded and the
    socket shut both ways, which ends the other direction's read too.
    """
    loop = asyncio.get_running_loop()
    try:
        async for request in requests:
            if request.WhichOneof("kind") != "data":
                raise invalid("only the first PortRequest may be `open`; then only `data`")
            await pace.account(len(request.data))
            if request.data:
                await loop.sock_sendall(sock, request.data)
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_WR)
    except asyncio.CancelledError:
        raise
    except ConnectionError as exc:
        failure.append(_reset(exc))
        _shut(sock)
    except Exception as exc:  # a bad message or a broken stream ends the connection
        failure.append(exc)
        _shut(sock)


async def _out_of_sandbox(sock: socket.socket) -> AsyncIterator[pb.PortEvent]:
    """Sandbox -> client, one chunk at a time; ``eof`` when the peer inside closes."""
    loop = asyncio.get_running_loop()
    while True:
        try:
            data = await loop.sock_recv(sock, CHUNK_BYTES)
        except ConnectionError as exc:
            raise _reset(exc) from None
        if not data:
            yield pb.PortEvent(eof=True)
            return
        yield pb.PortEvent(data=data)


def _shut(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)


def _reset(exc: OSError) -> ServiceError:
    return ServiceError(
        grpc.StatusCode.ABORTED,
        "PORT_CONNECTION_RESET",
        f"the connection inside the sandbox was reset ({exc.strerror or exc})",
        fault="task",
    )
