"""Port forwarding through a real ``orchard up``: real runc sandboxes with policy ``none``.

Servers run inside the sandbox (Python's ``http.server`` from the default image,
and a WebSocket echo server on the ``websockets`` package, uploaded into the
sandbox from this venv as pure Python: the image does not ship it), and are
reached from here through ``forward_port`` / ``connect_port`` only: the sandbox
keeps policy ``none`` and no port of it is published anywhere.

The hostile half: targets outside the sandbox (other addresses, the node's own
loopback services, another sandbox's token), malformed streams, and far more
streams than a sandbox's share, against the executor's own checks (the raw
stub, past the SDK's checks).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import hashlib
import logging
import os
import shutil
import signal
import socket
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from orchard import AsyncOrchard, Orchard, PortNotListeningError, QuotaExceededError, Sandbox
from orchard._proto.orchard.v1 import executor_pb2 as pb
from tests.port_serving import start_server
from tests.stack import ORCHARD, REQUIRES_STACK, Stack, running_stack

pytestmark = REQUIRES_STACK

websockets = pytest.importorskip("websockets")
from websockets.asyncio.client import connect as ws_connect  # noqa: E402
from websockets.sync.client import connect as ws_connect_sync  # noqa: E402

# A sandbox may hold this many forwarded connections at once in this stack.
SHARE = 40
HTTP_PORT = 8000
WS_PORT = 8765

WS_SERVER = """
import asyncio
import sys
from websockets.asyncio.server import serve

async def echo(ws):
    async for message in ws:
        await ws.send(message)

async def main():
    async with serve(echo, "127.0.0.1", int(sys.argv[1]), max_size=None):
        await asyncio.get_running_loop().create_future()

asyncio.run(main())
"""


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    home = tmp_path_factory.mktemp("ports") / "home"
    env = {"ORCHARD_PORT_CONNECTIONS_PER_SANDBOX": str(SHARE)}
    with running_stack(home, extra_env=env) as running:
        yield running


@pytest.fixture(scope="module")
def client(stack: Stack) -> Iterator[Orchard]:
    key = (stack.home / "dev-api-key").read_text().strip()
    with Orchard(stack.endpoint, key) as client:
        yield client


def _websockets_into(sb: Sandbox, tmp_path: Path) -> None:
    """Upload the websockets package (pure Python: its optional C speedups left out)."""
    source = Path(websockets.__file__).parent
    target = tmp_path / "pylib" / "websockets"
    shutil.copytree(source, target, ignore=shutil.ignore_patterns("*.so", "__pycache__"))
    sb.upload(tmp_path / "pylib", "/opt/pylib")
    sb.write_file("/opt/ws_echo.py", WS_SERVER)


def _fetch(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=60) as response:
        return bytes(response.read())


@pytest.fixture(scope="module")
def web(client: Orchard) -> Iterator[Sandbox]:
    """A sandbox (policy none) serving /srv over HTTP on its loopback."""
    with client.sandboxes.create(network="none", ttl=900, memory="512Mi") as sb:
        sb.write_file("/srv/index.html", "<h1>inside</h1>\n")
        sb.exec("head -c 8388608 /dev/urandom > /srv/big.bin", timeout=30)
        start_server(
            sb, f"python3 -m http.server {HTTP_PORT} --bind 127.0.0.1 --directory /srv", HTTP_PORT
        )
        yield sb


def test_http_many_connections_at_once(web: Sandbox) -> None:
    big = web.read_file("/srv/big.bin")
    with web.forward_port(HTTP_PORT) as fwd:
        assert fwd.url == f"http://127.0.0.1:{fwd.local_port}"
        with concurrent.futures.ThreadPoolExecutor(32) as pool:
            pages = list(pool.map(_fetch, [f"{fwd.url}/index.html"] * 200))
            bigs = list(pool.map(_fetch, [f"{fwd.url}/big.bin"] * 8))
        assert pages == [b"<h1>inside</h1>\n"] * 200
        assert {hashlib.sha256(b).hexdigest() for b in bigs} == {hashlib.sha256(big).hexdigest()}
        assert fwd.accepted == 208 and fwd.last_error is None
    # No network policy was opened for any of it.
    assert web.info().network.mode == "none"
    # Nor can the sandbox reach out (policy none: loopback only).
    probe = web.exec(
        "python3 -c \"import socket; socket.create_connection(('10.0.0.1', 80), timeout=2)\""
    )
    assert probe.exit_code != 0


def test_through_the_gateways_data_plane_proxy(stack: Stack, web: Sandbox) -> None:
    """ORCHARD_DATA_PLANE=proxy: the same streams through the gateway's pass-through."""
    key = (stack.home / "dev-api-key").read_text().strip()
    with Orchard(stack.endpoint, key, data_plane="proxy") as proxied:
        sb = proxied.sandboxes.connect(web.id)
        with sb.forward_port(HTTP_PORT) as fwd, concurrent.futures.ThreadPoolExecutor(8) as pool:
            pages = list(pool.map(_fetch, [f"{fwd.url}/index.html"] * 32))
        assert pages == [b"<h1>inside</h1>\n"] * 32
        with pytest.raises(PortNotListeningError):
            sb.connect_port(9)


def test_cli_port_forward(stack: Stack, web: Sandbox) -> None:
    process = subprocess.Popen(
        [*ORCHARD, "port-forward", web.id, str(HTTP_PORT)],
        env=stack.env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        text=True,
    )
    try:
        assert process.stdout is not None
        url = process.stdout.readline().strip()
        assert url.startswith("http://127.0.0.1:")
        assert _fetch(f"{url}/index.html") == b"<h1>inside</h1>\n"
    finally:
        process.send_signal(signal.SIGTERM)
        _, err = process.communicate(timeout=30)
    assert process.returncode == 0 and "Traceback" not in err, err


def test_raw_socket_half_close(web: Sandbox) -> None:
    sock = web.connect_port(HTTP_PORT)
    sock.sendall(b"GET /index.html HTTP/1.0\r\nHost: x\r\n\r\n")
    sock.shutdown(socket.SHUT_WR)
    answer = b"".join(iter(lambda: sock.recv(65536), b""))
    sock.close()
    assert answer.startswith(b"HTTP/1.0 200") and answer.endswith(b"<h1>inside</h1>\n")


def test_ipv6_loopback(web: Sandbox) -> None:
    bind = "import socket; socket.socket(socket.AF_INET6).bind(('::1', 0))"
    if web.exec(["python3", "-c", bind]).exit_code != 0:
        pytest.skip("the sandbox has no IPv6 loopback")
    start_server(web, "python3 -m http.server 8001 --bind ::1 --directory /srv", 8001, host="::1")
    with web.forward_port(8001, host="::1") as fwd:
        assert _fetch(f"{fwd.url}/index.html") == b"<h1>inside</h1>\n"
    # The same port on 127.0.0.1 is another address: nothing listens there.
    with pytest.raises(PortNotListeningError):
        web.connect_port(8001)


def test_refused_inside_closes_the_local_connection_and_says_so(
    web: Sandbox, caplog: pytest.LogCaptureFixture
) -> None:
    with pytest.raises(PortNotListeningError) as refused:
        web.connect_port(9)
    assert isinstance(refused.value, ConnectionRefusedError) and "9" in str(refused.value)
    with caplog.at_level(logging.WARNING, "orchard.ports"), web.forward_port(9) as fwd:
        local = socket.create_connection(fwd.local_address, timeout=10)
        with pytest.raises(ConnectionResetError):
            local.recv(1)
        local.close()
        assert isinstance(fwd.last_error, PortNotListeningError)
    assert any("port 9" in r.getMessage() for r in caplog.records)


def test_reset_inside_resets_the_local_connection(web: Sandbox) -> None:
    web.write_file(
        "/opt/rst.py",
        "import socket, struct\n"
        "s = socket.create_server(('127.0.0.1', 8099))\n"
        "while True:\n"
        "    c, _ = s.accept(); c.recv(10)\n"
        "    c.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack('ii', 1, 0)); c.close()\n",
    )
    start_server(web, "python3 /opt/rst.py", 8099)
    with web.forward_port(8099) as fwd:
        local = socket.create_connection(fwd.local_address, timeout=10)
        local.sendall(b"hi")
        with pytest.raises(ConnectionResetError):
            while local.recv(1):
                pass
        local.close()
        deadline = time.monotonic() + 10
        while fwd.last_error is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert fwd.last_error is not None and fwd.last_error.reason == "PORT_CONNECTION_RESET"


FIREHOSE = """
import socket, threading
s = socket.create_server(("127.0.0.1", 8097))
def pour(c):
    block = b"z" * 65536
    try:
        while True:
            c.sendall(block)
    except OSError:
        c.close()
while True:
    c, _ = s.accept()
    threading.Thread(target=pour, args=(c,), daemon=True).start()
"""


def _rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError(f"no VmRSS for {pid}")


def _executor_pid(stack: Stack) -> int:
    children = Path(f"/proc/{stack.process.pid}/task/{stack.process.pid}/children")
    for child in children.read_text().split():
        if b"orchard.executor" in Path(f"/proc/{child}/cmdline").read_bytes().split(b"\0"):
            return int(child)
    raise AssertionError("no executor under orchard up")


def test_a_peer_that_does_not_read_holds_memory_bounded(stack: Stack, web: Sandbox) -> None:
    """A server inside pours without end and the local peers read nothing: gRPC's
    per-stream flow control stops it; neither the executor nor this client buffers it."""
    web.write_file("/opt/firehose.py", FIREHOSE)
    start_server(web, "python3 /opt/firehose.py", 8097)
    executor = _executor_pid(stack)
    before = (_rss_kib(executor), _rss_kib(os.getpid()))
    with web.forward_port(8097) as fwd:
        peers = [socket.create_connection(fwd.local_address, timeout=30) for _ in range(8)]
        for peer in peers:
            peer.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 65536)
        time.sleep(3)  # long enough for ~GiBs at the measured throughput
        after = (_rss_kib(executor), _rss_kib(os.getpid()))
        # Each still works: read a MiB from each.
        for peer in peers:
            got = 0
            while got < 1 << 20:
                got += len(peer.recv(1 << 16))
            peer.close()
    grown_mib = [(a - b) / 1024 for a, b in zip(after, before, strict=True)]
    assert grown_mib[0] < 64 and grown_mib[1] < 64, grown_mib


def test_websocket_sync(web: Sandbox, tmp_path: Path) -> None:
    _websockets_into(web, tmp_path)
    start_server(web, f"PYTHONPATH=/opt/pylib python3 /opt/ws_echo.py {WS_PORT}", WS_PORT)
    with (
        web.forward_port(WS_PORT) as fwd,
        ws_connect_sync(f"ws://127.0.0.1:{fwd.local_port}/", max_size=None) as ws,
    ):
        for text in ("hello", "ünïcode", "x" * 100_000):
            ws.send(text)
            assert ws.recv() == text
        blob = os.urandom(1 << 20)
        ws.send(blob)
        assert ws.recv() == blob
    # The same server over one raw socket, no listener.
    with ws_connect_sync("ws://sandbox/", sock=web.connect_port(WS_PORT)) as ws:
        ws.send("raw")
        assert ws.recv() == "raw"


def test_websocket_async_many_at_once(stack: Stack, web: Sandbox) -> None:
    key = (stack.home / "dev-api-key").read_text().strip()

    async def one(url: str, n: int) -> None:
        async with ws_connect(url, max_size=None) as ws:
            for i in range(20):
                message = f"{n}:{i}:" + "y" * (i * 1000)
                await ws.send(message)
                assert await ws.recv() == message

    async def main() -> None:
        async with AsyncOrchard(stack.endpoint, key) as aclient:
            sb = await aclient.sandboxes.connect(web.id)
            async with await sb.forward_port(WS_PORT) as fwd:
                await asyncio.gather(
                    *(one(f"ws://127.0.0.1:{fwd.local_port}/", n) for n in range(24))
                )
                assert fwd.accepted == 24 and fwd.last_error is None
            sock = await sb.connect_port(WS_PORT)
            async with ws_connect("ws://sandbox/", sock=sock) as ws:
                await ws.send(b"\x00binary")
                assert await ws.recv() == b"\x00binary"
            with pytest.raises(PortNotListeningError):
                await sb.connect_port(9)

    asyncio.run(main())


# ---- hostile clients ------------------------------------------------------------------


def _raw(sb: Sandbox, *requests: pb.PortRequest, token: str | None = None) -> grpc.RpcError:
    """Send ``requests`` on ConnectPort past the SDK's checks; the call's error."""
    stub, access = sb._executor()
    metadata = access.metadata if token is None else (("authorization", f"Bearer {token}"),)
    call = stub.ConnectPort(iter(requests), metadata=metadata, timeout=30)
    with pytest.raises(grpc.RpcError) as failed:
        for _ in call:
            pass
    return failed.value


def _open(sandbox_id: str, port: int, host: str = "") -> pb.PortRequest:
    return pb.PortRequest(open=pb.PortOpen(sandbox_id=sandbox_id, port=port, host=host))


def test_hostile_targets_outside_the_sandbox_are_refused(stack: Stack, web: Sandbox) -> None:
    # Any address but the sandbox's loopback, however spelled.
    for host in (
        "10.0.0.1",
        "0.0.0.0",
        "localhost",
        "::ffff:127.0.0.1",
        "127.0.0.2",
        "::",
        "x" * 5000,
    ):
        err = _raw(web, _open(web.id, HTTP_PORT, host))
        assert err.code() == grpc.StatusCode.INVALID_ARGUMENT, host
    for port in (0, 65536, 2**32 - 1):
        assert _raw(web, _open(web.id, port)).code() == grpc.StatusCode.INVALID_ARGUMENT
    # Not `open` first; `open` again mid-stream.
    assert _raw(web, pb.PortRequest(data=b"x")).code() == grpc.StatusCode.INVALID_ARGUMENT
    again = _raw(web, _open(web.id, HTTP_PORT), _open(web.id, HTTP_PORT))
    assert again.code() == grpc.StatusCode.INVALID_ARGUMENT

    # The node's own loopback is not the sandbox's: a listener the test holds on the host,
    # the gateway and the executor are all "nothing listens" from inside, and the host
    # listener never sees a connection.
    host_listener = socket.create_server(("127.0.0.1", 0))
    host_listener.settimeout(0.5)
    executor_port = int(
        (stack.home / "run" / "executor.addr").read_text().strip().rsplit(":", 1)[1]
    )
    for port in (
        host_listener.getsockname()[1],
        int(stack.endpoint.rsplit(":", 1)[1]),
        executor_port,
    ):
        with pytest.raises(PortNotListeningError):
            web.connect_port(port)
    with pytest.raises(TimeoutError):
        host_listener.accept()
    host_listener.close()


def test_hostile_other_sandboxes_token(client: Orchard, web: Sandbox) -> None:
    with client.sandboxes.create(network="none", ttl=300) as other:
        other_token = other._executor()[1].token
        err = _raw(web, _open(web.id, HTTP_PORT), token=other_token)
        assert err.code() == grpc.StatusCode.UNAUTHENTICATED
        err = _raw(web, _open(web.id, HTTP_PORT), token="not-a-token")
        assert err.code() == grpc.StatusCode.UNAUTHENTICATED


def test_hostile_stream_flood_stops_at_the_sandboxes_share(
    stack: Stack, client: Orchard, web: Sandbox
) -> None:
    key = (stack.home / "dev-api-key").read_text().strip()

    async def flood() -> tuple[list[socket.socket], list[BaseException]]:
        async with AsyncOrchard(stack.endpoint, key) as aclient:
            sb = await aclient.sandboxes.connect(web.id)
            results = await asyncio.gather(
                *(sb.connect_port(HTTP_PORT) for _ in range(5 * SHARE)), return_exceptions=True
            )
            held = [r for r in results if isinstance(r, socket.socket)]
            errors = [r for r in results if isinstance(r, BaseException)]
            # Keep the relays running while the sync checks below look (on this loop).
            await asyncio.get_running_loop().run_in_executor(None, check, held)
            for sock in held:
                sock.close()
            return held, errors

    def check(held: list[socket.socket]) -> None:
        with pytest.raises(QuotaExceededError) as refused:
            web.connect_port(HTTP_PORT)
        assert "share" in str(refused.value)
        # Another sandbox's share is its own: it still connects.
        with client.sandboxes.create(network="none", ttl=300) as other:
            start_server(other, "python3 -m http.server 8000 --bind 127.0.0.1", 8000)
        # The executor itself is fine.
        assert web.exec("echo ok").stdout == b"ok\n"

    held, errors = asyncio.run(flood())
    assert len(held) == SHARE
    assert errors and all(isinstance(e, QuotaExceededError) for e in errors)
    # Closed streams give their share back.
    deadline = time.monotonic() + 10
    while True:
        try:
            web.connect_port(HTTP_PORT).close()
            break
        except QuotaExceededError:
            assert time.monotonic() < deadline, "the share was not given back"
            time.sleep(0.1)
