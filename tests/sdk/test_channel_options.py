"""The SDK's channel options against a real gRPC server reached through a slow link.

gRPC core takes ``grpc.min_reconnect_backoff_ms`` as the deadline of a connection attempt,
handshake included (grpc/grpc#33423): with it at 200 ms, a server whose HTTP/2 SETTINGS
came later than that (a runsc sandbox's executor on a loaded machine, seen in the suite)
failed the first call with UNAVAILABLE "connection attempt timed out before receiving
SETTINGS frame". The relay here is a real TCP relay on loopback that holds the server's
first bytes back.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Iterator
from concurrent import futures

import grpc
import pytest

from orchard.client._transport import DEFAULT_CHANNEL_OPTIONS

HOLD_SECONDS = 0.8


def _pipe(src: socket.socket, dst: socket.socket, hold: float) -> None:
    first = True
    try:
        while chunk := src.recv(65536):
            if first and hold:
                time.sleep(hold)
            first = False
            dst.sendall(chunk)
    except OSError:
        pass
    finally:
        for s in (src, dst):
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)


@pytest.fixture
def slow_link() -> Iterator[str]:
    """A gRPC server (one echo method) behind a relay that delays the server's first bytes."""
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    handler = grpc.method_handlers_generic_handler(
        "test.Echo",
        {"Echo": grpc.unary_unary_rpc_method_handler(lambda request, context: request)},
    )
    server.add_generic_rpc_handlers((handler,))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    listener = socket.create_server(("127.0.0.1", 0))
    stop = threading.Event()
    opened: list[socket.socket] = []
    pipes: list[threading.Thread] = []

    def accept() -> None:
        listener.settimeout(0.2)
        while not stop.is_set():
            try:
                client, _ = listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            upstream = socket.create_connection(("127.0.0.1", port))
            opened.extend((client, upstream))
            for args in ((client, upstream, 0.0), (upstream, client, HOLD_SECONDS)):
                pipes.append(threading.Thread(target=_pipe, args=args, daemon=True))
                pipes[-1].start()

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield f"127.0.0.1:{listener.getsockname()[1]}"
    finally:
        stop.set()
        thread.join(5)
        listener.close()
        server.stop(0)
        for pipe in pipes:
            pipe.join(5)
        for sock in opened:
            sock.close()


def test_a_handshake_slower_than_the_reconnect_backoff_still_connects(slow_link: str) -> None:
    with grpc.insecure_channel(slow_link, options=DEFAULT_CHANNEL_OPTIONS) as channel:
        echo = channel.unary_unary("/test.Echo/Echo")
        started = time.monotonic()
        assert echo(b"ping", timeout=30) == b"ping"
        assert time.monotonic() - started >= HOLD_SECONDS  # the link really held it back
