"""Hostile clients against the nginx data-plane proxy's connection phases.

Real nginx (Debian's package) runs the conf ``proxy_nginx.render_conf`` writes.
Attackers hold no token (nginx checks none) and try to hold connections: one that
sends nothing, one that sends the HTTP/2 preface and then nothing, one that drips a
HEADERS frame a byte a second, one that drips the preface, one left idle after a
request. Each must be closed by nginx within its bound (:class:`NginxTimeouts`), here
shortened to seconds so the test is quick; the defaults are checked to be the
documented ones. A silent stream longer than every one of those bounds must still
complete: its upstream is a small gRPC server standing in for the node executor
(what is tested is nginx's timeouts; the executor behind real nginx is
tests/gateway/test_nginx_proxy.py).
"""

from __future__ import annotations

import asyncio
import shutil
import socket
import struct
import subprocess
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest
from orchard.gateway.proxy_nginx import EXECUTOR_SERVICE, NginxPaths, NginxTimeouts, render_conf

NGINX = shutil.which("nginx") or "/usr/sbin/nginx"
pytestmark = [
    pytest.mark.reliability,
    pytest.mark.timeout(120),
    pytest.mark.skipif(not Path(NGINX).exists(), reason="needs nginx (make system-deps)"),
]

SHORT = NginxTimeouts(header_seconds=2, idle_seconds=4, connection_seconds=5, stream_seconds=60)
SLACK = 1.5
"""nginx's timers fire within a few ms; the slack is for a loaded 2-core machine."""
PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
SETTINGS = b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"


def _frame(kind: int, flags: int, stream: int, payload: bytes) -> bytes:
    return (
        struct.pack(">I", len(payload))[1:]
        + bytes([kind, flags])
        + struct.pack(">I", stream)
        + payload
    )


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Proxy:
    port: int

    def connect(self) -> socket.socket:
        return socket.create_connection(("127.0.0.1", self.port), timeout=5)


def _silent_upstream(hold_seconds: float) -> tuple[grpc.aio.Server, int]:
    """A stand-in executor: its Exec answers one message after ``hold_seconds`` of silence."""

    async def exec_(requests: object, context: grpc.aio.ServicerContext[bytes, bytes]) -> object:
        await asyncio.sleep(hold_seconds)
        yield b""

    handler = grpc.method_handlers_generic_handler(
        EXECUTOR_SERVICE,
        {"Exec": grpc.stream_stream_rpc_method_handler(exec_)},  # type: ignore[arg-type]
    )
    server = grpc.aio.server()
    server.add_generic_rpc_handlers((handler,))
    return server, server.add_insecure_port("127.0.0.1:0")


@pytest.fixture
def proxy(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Callable[[int], Proxy]]:
    started: list[subprocess.Popen[bytes]] = []

    def start(upstream_port: int, timeouts: NginxTimeouts = SHORT) -> Proxy:
        port = _free_port()
        paths = NginxPaths(tmp_path / f"run{len(started)}", tmp_path / "logs")
        paths.create()
        paths.conf.write_text(
            render_conf(
                f"127.0.0.1:{port}", [f"127.0.0.1:{upstream_port}"], paths, timeouts=timeouts
            )
        )
        process = subprocess.Popen([NGINX, "-c", str(paths.conf), "-p", str(paths.root)])
        started.append(process)
        deadline = time.monotonic() + 10
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                break
            except OSError:
                assert process.poll() is None and time.monotonic() < deadline, "nginx did not start"
                time.sleep(0.02)
        return Proxy(port)

    yield start
    for process in started:
        process.terminate()
        process.wait(10)


def _closed_after(sock: socket.socket, limit: float) -> float | None:
    """Seconds until the peer closes ``sock`` (EOF or reset), reading whatever it sends;
    None when it is still open after ``limit``."""
    start = time.monotonic()
    while (left := limit - (time.monotonic() - start)) > 0:
        sock.settimeout(left)
        try:
            if not sock.recv(65536):
                return time.monotonic() - start
        except TimeoutError:
            return None
        except ConnectionResetError:
            return time.monotonic() - start
    return None


def _drip(sock: socket.socket, data: bytes, every: float, limit: float) -> float | None:
    """Send ``data`` a byte every ``every`` seconds; seconds until the peer closed, or None."""
    start = time.monotonic()
    for byte in data:
        try:
            sock.sendall(bytes([byte]))
        except (BrokenPipeError, ConnectionResetError):
            return time.monotonic() - start
        if _closed_after(sock, every) is not None:
            return time.monotonic() - start
        if time.monotonic() - start > limit:
            return None
    return None


def _attacks() -> dict[str, Callable[[socket.socket], float | None]]:
    limit = 20.0

    def nothing(s: socket.socket) -> float | None:
        return _closed_after(s, limit)

    def preface_then_nothing(s: socket.socket) -> float | None:
        s.sendall(PREFACE + SETTINGS)
        return _closed_after(s, limit)

    def drip_preface(s: socket.socket) -> float | None:
        return _drip(s, PREFACE, 0.5, limit)

    def drip_headers(s: socket.socket) -> float | None:
        # A HEADERS frame announcing 200 bytes of valid HPACK (":method: GET" repeated).
        header = struct.pack(">I", 200)[1:] + bytes([1, 4]) + struct.pack(">I", 1)
        s.sendall(PREFACE + SETTINGS + header)
        return _drip(s, b"\x82" * 200, 0.5, limit)

    def idle_after_a_request(s: socket.socket) -> float | None:
        block = bytes([0x83, 0x86, 0x84])  # POST, http, "/" (answered UNIMPLEMENTED)
        s.sendall(PREFACE + SETTINGS + _frame(1, 5, 1, block))
        time.sleep(0.2)
        s.settimeout(2)
        assert s.recv(65536), "nginx answered nothing"
        return _closed_after(s, limit)

    return {
        "nothing": nothing,
        "preface_then_nothing": preface_then_nothing,
        "drip_preface": drip_preface,
        "drip_headers": drip_headers,
        "idle_after_a_request": idle_after_a_request,
    }


BOUNDS = {
    # Nothing, or only the preface: client_header_timeout.
    "nothing": SHORT.header_seconds,
    "preface_then_nothing": SHORT.header_seconds,
    "drip_preface": SHORT.header_seconds,
    # A half-sent frame and an idle connection after a request: keepalive_timeout (nginx
    # does not restart the timer for each dripped byte).
    "drip_headers": SHORT.idle_seconds,
    "idle_after_a_request": SHORT.idle_seconds,
}


def test_connections_without_a_token_are_closed_within_their_bound(
    proxy: Callable[[int], Proxy],
) -> None:
    """Four connections of each attack at once; each is closed by nginx within its bound."""
    ngx = proxy(_free_port())  # no upstream: none of these reaches one
    attacks = _attacks()
    assert set(attacks) == set(BOUNDS)
    runs = [name for name in attacks for _ in range(4)]
    sockets = [ngx.connect() for _ in runs]
    try:
        with ThreadPoolExecutor(len(runs)) as pool:
            closed = list(pool.map(lambda n, s: attacks[n](s), runs, sockets))
    finally:
        for sock in sockets:
            sock.close()
    late = {
        f"{name}#{i % 4}": after
        for i, (name, after) in enumerate(zip(runs, closed, strict=True))
        if after is None or after > BOUNDS[name] + SLACK
    }
    assert late == {}, f"held past their bound (seconds; None = still open): {late}"


def test_a_silent_stream_outlives_every_pre_request_bound(proxy: Callable[[int], Proxy]) -> None:
    """An open stream silent for longer than the header, idle and connection-age bounds
    (an exec printing nothing) is not cut: those bounds apply before a stream exists."""
    hold = SHORT.connection_seconds + 2.0

    async def call() -> list[bytes]:
        server, port = _silent_upstream(hold)
        await server.start()
        try:
            ngx = proxy(port)
            async with grpc.aio.insecure_channel(f"127.0.0.1:{ngx.port}") as channel:
                exec_ = channel.stream_stream(f"/{EXECUTOR_SERVICE}/Exec")
                started = time.monotonic()
                replies = [r async for r in exec_(iter([b""]), timeout=hold + 20)]
                assert time.monotonic() - started >= hold
                return replies  # type: ignore[return-value]
        finally:
            await server.stop(None)

    assert asyncio.run(call()) == [b""]


def test_the_default_bounds_are_the_documented_ones(tmp_path: Path) -> None:
    conf = render_conf("127.0.0.1:1", ["127.0.0.1:2"], NginxPaths(tmp_path, tmp_path))
    for line in (
        "client_header_timeout 10s;",
        "keepalive_timeout 75s;",
        "keepalive_time 3600s;",
        "client_body_timeout 86400s;",
        "send_timeout 86400s;",
        "grpc_read_timeout 86400s;",
        "grpc_send_timeout 86400s;",
    ):
        assert line in conf, line
    with pytest.raises(ValueError, match="at least 1 second"):
        NginxTimeouts(idle_seconds=0)
