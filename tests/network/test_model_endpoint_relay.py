"""The model endpoint's relay (``local.model_endpoint``) without a stack: a network namespace
the test makes (``unshare --net``, only ``lo``) stands for the sandbox, and a real HTTP server
on the host's loopback for the model proxy.

The test's own clients are sockets created *inside* that namespace (``orchard.common.netns``),
so they see exactly what a process of a ``none`` sandbox sees: its loopback and nothing else.
Checked: the relay reaches the target and counts the bytes; the caps answer 429 naming the
cap while another sandbox is served; idle connections close; no proxy is a clear 503; a port
already taken inside, the node's own namespace and a gone init are refused; ``close`` ends
every connection and the listener; an ``https`` target is spoken to in TLS while the
sandbox side stays plain HTTP.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import socket
import ssl
import subprocess
import threading
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from orchard.scheduler.backends.base import BackendError
from orchard.scheduler.backends.local.model_endpoint import (
    ModelEndpoints,
    ModelEndpointSettings,
    parse_target,
)

from orchard.common import local_ca
from orchard.common.netns import NetnsSockets

pytestmark = [
    pytest.mark.skipif(os.geteuid() != 0, reason="needs root (setns)"),
    pytest.mark.skipif(
        shutil.which("unshare") is None or shutil.which("ip") is None,
        reason="needs util-linux and iproute2",
    ),
]


class _Answer(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.0"

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        reply = json.dumps({"path": self.path, "got": len(body)}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(reply)))
        self.end_headers()
        self.wfile.write(reply)

    def log_message(self, *args: object) -> None:
        pass


@contextmanager
def model_proxy_stand_in(tls: ssl.SSLContext | None = None) -> Iterator[int]:
    """A real HTTP server on the host's loopback standing in for the model proxy."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Answer)
    server.daemon_threads = True
    if tls is not None:
        server.socket = tls.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()


@contextmanager
def _namespace() -> Iterator[int]:
    """A process alone in a new network namespace (root "/"), as a sandbox's init."""
    inside = subprocess.Popen(
        ["unshare", "--net", "sh", "-c", "ip link set lo up && echo ready && exec sleep 600"],
        stdout=subprocess.PIPE,
    )
    try:
        assert inside.stdout is not None and inside.stdout.readline() == b"ready\n"
        yield inside.pid
    finally:
        inside.kill()
        inside.wait()
        if inside.stdout is not None:
            inside.stdout.close()


@pytest.fixture
def sockets() -> Iterator[NetnsSockets]:
    made = NetnsSockets()
    yield made
    made.close()


async def _inside(sockets: NetnsSockets, pid: int, port: int = 7711) -> socket.socket:
    """A client socket in the namespace, connected to ``port`` on its loopback."""
    sock = await sockets.socket_for(pid, Path("/"))
    try:
        await asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", port))
    except BaseException:
        sock.close()
        raise
    return sock


async def _request(sock: socket.socket, body: bytes = b"{}") -> bytes:
    """One HTTP/1.0 POST (the server closes after it); the whole answer. Closes ``sock``."""
    loop = asyncio.get_running_loop()
    head = f"POST /s/cred/v1/chat/completions HTTP/1.0\r\nContent-Length: {len(body)}\r\n\r\n"
    with sock:
        await loop.sock_sendall(sock, head.encode() + body)
        answer = b""
        while chunk := await asyncio.wait_for(loop.sock_recv(sock, 65536), 10):
            answer += chunk
    return answer


def _json_body(answer: bytes) -> dict[str, object]:
    return dict(json.loads(answer.partition(b"\r\n\r\n")[2]))


@asynccontextmanager
async def _endpoints(tmp_path: Path, **settings: object) -> AsyncIterator[ModelEndpoints]:
    endpoints = ModelEndpoints(ModelEndpointSettings(**settings), tmp_path)  # type: ignore[arg-type]
    try:
        yield endpoints
    finally:
        await endpoints.close_all()


def test_a_connection_inside_reaches_the_target_and_its_bytes_are_counted(
    tmp_path: Path, sockets: NetnsSockets
) -> None:
    async def main(pid: int, port: int) -> None:
        async with _endpoints(tmp_path, target=f"127.0.0.1:{port}") as endpoints:
            await endpoints.open("sb-a", pid, Path("/"), "tenant-a")
            answer = await _request(await _inside(sockets, pid), b"x" * 5000)
            assert answer.startswith(b"HTTP/1.0 200"), answer[:200]
            assert _json_body(answer) == {"path": "/s/cred/v1/chat/completions", "got": 5000}
            await asyncio.sleep(0.05)
            stats = endpoints.stats("sb-a")
            assert stats is not None and stats.connections == 1 and stats.open == 0
            assert stats.bytes_to_proxy > 5000 and stats.bytes_to_sandbox == len(answer)
            # the same port on the node's own loopback is not what the namespace reached
            with pytest.raises(ConnectionRefusedError):
                socket.create_connection(("127.0.0.1", 7711), 1)

    with model_proxy_stand_in() as port, _namespace() as pid:
        asyncio.run(main(pid, port))


def test_the_target_comes_from_the_address_file_when_it_changes(
    tmp_path: Path, sockets: NetnsSockets
) -> None:
    async def main(pid: int, port: int) -> None:
        async with _endpoints(tmp_path) as endpoints:
            await endpoints.open("sb-a", pid, Path("/"), "t")
            # no proxy announced yet: a clear 503, not a hang or a reset
            refused = await _request(await _inside(sockets, pid))
            assert refused.startswith(b"HTTP/1.1 503"), refused[:200]
            error = _json_body(refused)["error"]
            assert isinstance(error, dict) and error["code"] == "MODEL_PROXY_NOT_RUNNING"
            (tmp_path / "modelproxy.addr").write_text(f"http://127.0.0.1:{port}\n")
            served = await _request(await _inside(sockets, pid))
            assert served.startswith(b"HTTP/1.0 200"), served[:200]
            # the proxy moved (a restart on another port): followed at once
            (tmp_path / "modelproxy.addr").write_text("http://127.0.0.1:1\n")
            gone = await _request(await _inside(sockets, pid))
            assert gone.startswith(b"HTTP/1.1 502"), gone[:200]
            stats = endpoints.stats("sb-a")
            assert stats is not None and stats.unreachable == 2 and stats.connections == 1

    with model_proxy_stand_in() as port, _namespace() as pid:
        asyncio.run(main(pid, port))


def test_caps_answer_429_naming_the_cap_and_other_sandboxes_are_served(
    tmp_path: Path, sockets: NetnsSockets
) -> None:
    async def main(pid_a: int, pid_b: int, port: int) -> None:
        caps = {"max_connections": 3, "max_connections_per_tenant": 4, "max_connections_node": 8}
        async with _endpoints(tmp_path, target=f"127.0.0.1:{port}", **caps) as endpoints:
            await endpoints.open("sb-a", pid_a, Path("/"), "tenant-a")
            await endpoints.open("sb-b", pid_b, Path("/"), "tenant-b")
            held = [await _inside(sockets, pid_a) for _ in range(3)]
            await asyncio.sleep(0.1)
            over = await _request(await _inside(sockets, pid_a))
            assert over.startswith(b"HTTP/1.1 429"), over[:200]
            assert b"Retry-After: 1" in over
            error = _json_body(over)["error"]
            assert isinstance(error, dict) and error["code"] == "MODEL_ENDPOINT_FULL"
            assert "this sandbox has 3 open model endpoint connections" in str(error["message"])
            # another tenant's sandbox is served while sb-a is at its cap
            assert (await _request(await _inside(sockets, pid_b))).startswith(b"HTTP/1.0 200")
            # a flood: 40 connects at once cost a bounded number of refusals, none served
            flood = [await _inside(sockets, pid_a) for _ in range(40)]
            await asyncio.sleep(0.3)
            stats = endpoints.stats("sb-a")
            assert stats is not None and stats.open == 3 and stats.connections == 3
            assert 1 <= stats.refused <= 12, stats  # paused 50 ms after each refusal
            for sock in (*held, *flood):
                sock.close()

            # The backlog drains: every one of the 44 connects (3 held, 1 over, 40 flood) is
            # accepted (relayed, then ended as its client has closed) or refused. Held == 0
            # alone is not drained: a closed client still in the backlog, accepted a moment
            # later, takes a slot again until its relay sees the close.
            def drained() -> bool:
                now = endpoints.stats("sb-a")
                settled = now is not None and now.connections + now.refused == 44
                return settled and endpoints.connections.held(sandbox="sb-a") == 0

            for _ in range(200):
                if drained():
                    break
                await asyncio.sleep(0.05)
            assert drained(), endpoints.stats("sb-a")
            assert (await _request(await _inside(sockets, pid_a))).startswith(b"HTTP/1.0 200")

    with model_proxy_stand_in() as port, _namespace() as pid_a, _namespace() as pid_b:
        asyncio.run(main(pid_a, pid_b, port))


def test_idle_connections_are_closed_and_close_ends_everything(
    tmp_path: Path, sockets: NetnsSockets
) -> None:
    async def main(pid: int, port: int) -> None:
        loop = asyncio.get_running_loop()
        async with _endpoints(tmp_path, target=f"127.0.0.1:{port}", idle_seconds=0.5) as endpoints:
            await endpoints.open("sb-a", pid, Path("/"), "t")
            with await _inside(sockets, pid) as quiet:  # closed on us after 0.5 s
                assert await asyncio.wait_for(loop.sock_recv(quiet, 10), 5) == b""
            busy = await _inside(sockets, pid)
            await asyncio.sleep(0.1)
            assert endpoints.connections.total == 1
            totals = await endpoints.close("sb-a")
            assert totals is not None and totals.connections == 2
            assert endpoints.connections.total == 0
            assert await asyncio.wait_for(loop.sock_recv(busy, 10), 5) == b""
            busy.close()
            with pytest.raises(ConnectionRefusedError):  # the listener is gone
                await _inside(sockets, pid)

    with model_proxy_stand_in() as port, _namespace() as pid:
        asyncio.run(main(pid, port))


def test_what_cannot_have_an_endpoint_is_refused(tmp_path: Path, sockets: NetnsSockets) -> None:
    async def main(pid: int) -> None:
        async with _endpoints(tmp_path, target="127.0.0.1:9") as endpoints:
            # the node's own namespace (this process, root "/"): never a listener there
            with pytest.raises(BackendError, match="node's network namespace"):
                await endpoints.open("sb-self", os.getpid(), Path("/"), "t")
            # a pid whose root is not the sandbox's: a reused pid, refused
            with pytest.raises(BackendError, match="root is not"):
                await endpoints.open("sb-reused", pid, tmp_path, "t")
            # something inside already listens on the port
            squatter = await sockets.socket_for(pid, Path("/"))
            squatter.bind(("127.0.0.1", 7711))
            squatter.listen()
            with pytest.raises(BackendError, match=r"cannot listen on 127\.0\.0\.1:7711"):
                await endpoints.open("sb-a", pid, Path("/"), "t")
            squatter.close()
            assert not endpoints.is_open("sb-a")

    with _namespace() as pid:
        asyncio.run(main(pid))


def test_an_https_target_is_spoken_to_in_tls_and_the_sandbox_side_stays_plain(
    tmp_path: Path, sockets: NetnsSockets
) -> None:
    ca, ca_key = local_ca.make_ca()
    cert, key = local_ca.issue(ca, ca_key, ["127.0.0.1"])
    (tmp_path / "ca.pem").write_bytes(local_ca.cert_pem(ca))
    (tmp_path / "server.pem").write_bytes(local_ca.cert_pem(cert))
    (tmp_path / "server.key").write_bytes(local_ca.key_pem(key))
    server_tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_tls.load_cert_chain(tmp_path / "server.pem", tmp_path / "server.key")

    async def main(pid: int, port: int) -> None:
        (tmp_path / "modelproxy.addr").write_text(f"https://127.0.0.1:{port}\n")
        async with _endpoints(tmp_path) as endpoints:
            await endpoints.open("sb-a", pid, Path("/"), "t")
            answer = await _request(await _inside(sockets, pid), b"{}")
            assert answer.startswith(b"HTTP/1.0 200"), answer[:200]

    with model_proxy_stand_in(server_tls) as port, _namespace() as pid:
        asyncio.run(main(pid, port))


@pytest.mark.parametrize(
    "text", ["ftp://h:1", "http://h", "h", "http://h:0", "http://h:1/v1", "http://:80", "h:99999"]
)
def test_bad_targets_are_refused(text: str) -> None:
    with pytest.raises(ValueError):
        parse_target(text)


def test_targets() -> None:
    assert str(parse_target("127.0.0.1:50090")) == "http://127.0.0.1:50090"
    assert parse_target("https://node.example:443/").tls
    with pytest.raises(ValueError, match="per sandbox <= per tenant <= node"):
        ModelEndpointSettings(max_connections=10, max_connections_per_tenant=5)
