"""Port forwarding's client side (both faces) on the in-process fake.

What is under test is the SDK's relay: the local listener, many connections
at once, half-close, refusals surfacing as PortNotListeningError (raised by
connect_port, logged and kept by forward_port), close() resetting what is
open. The fake maps a sandbox port to a real local server the test runs
(``FakeOrchard.map_port``), because a fake sandbox has no network of its own;
the real executor's side (network namespaces, shares, refusals) is tested on
real runc sandboxes in tests/e2e/test_ports_live.py.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import http.server
import socket
import threading
import urllib.request
from collections.abc import Iterator

import pytest

from orchard import InvalidRequestError, PortNotListeningError
from orchard.testing import FakeOrchard


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def http_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, int]]:
    root = tmp_path_factory.mktemp("www")
    (root / "index.txt").write_bytes(b"hello from the fake sandbox\n")
    (root / "big.bin").write_bytes(bytes(range(256)) * 8192)  # 2 MiB
    handler = lambda *a: _Quiet(*a, directory=str(root))  # noqa: E731
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server.server_address[:2]  # type: ignore[misc]
    server.shutdown()
    server.server_close()


@pytest.fixture
def fake() -> Iterator[FakeOrchard]:
    with FakeOrchard(run_commands=False) as fake:
        yield fake


def _fetch(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=30) as response:
        return bytes(response.read())


def test_sync_forward_and_connect(fake: FakeOrchard, http_server: tuple[str, int]) -> None:
    with fake.client() as client, client.sandboxes.create() as sb:
        fake.map_port(sb.id, 8000, http_server)
        with sb.forward_port(8000) as fwd:
            assert fwd.url.startswith("http://127.0.0.1:") and fwd.local_port > 0
            with concurrent.futures.ThreadPoolExecutor(16) as pool:
                bodies = list(pool.map(_fetch, [f"{fwd.url}/index.txt"] * 48))
            assert bodies == [b"hello from the fake sandbox\n"] * 48
            assert _fetch(f"{fwd.url}/big.bin") == bytes(range(256)) * 8192
            assert fwd.accepted == 49 and fwd.last_error is None
        # Closed: nothing listens there any more.
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection(fwd.local_address, timeout=5)

        sock = sb.connect_port(8000)
        sock.sendall(b"GET /index.txt HTTP/1.0\r\n\r\n")
        sock.shutdown(socket.SHUT_WR)  # half-close: the answer still comes back
        answer = b"".join(iter(lambda: sock.recv(65536), b""))
        sock.close()
        assert answer.startswith(b"HTTP/1.0 200") and answer.endswith(b"fake sandbox\n")


def test_sync_refusals(fake: FakeOrchard) -> None:
    with fake.client() as client, client.sandboxes.create() as sb:
        with pytest.raises(PortNotListeningError) as refused:
            sb.connect_port(9)
        assert isinstance(refused.value, ConnectionRefusedError)
        assert refused.value.reason == "PORT_NOT_LISTENING"
        with pytest.raises(InvalidRequestError):
            sb.connect_port(0)
        with pytest.raises(InvalidRequestError):
            sb.forward_port(8000, host="10.0.0.1")
        with sb.forward_port(9) as fwd:
            local = socket.create_connection(fwd.local_address, timeout=10)
            # Refused inside: the local connection ends (reset) and the forward says why.
            with pytest.raises(ConnectionResetError):
                local.recv(1)
            local.close()
            assert isinstance(fwd.last_error, PortNotListeningError)


def test_async_forward_and_connect(fake: FakeOrchard, http_server: tuple[str, int]) -> None:
    async def main() -> None:
        async with fake.async_client() as client:
            sb = await client.sandboxes.create()
            fake.map_port(sb.id, 8000, http_server)
            async with await sb.forward_port(8000) as fwd:
                loop = asyncio.get_running_loop()
                bodies = await asyncio.gather(
                    *(loop.run_in_executor(None, _fetch, f"{fwd.url}/index.txt") for _ in range(24))
                )
                assert bodies == [b"hello from the fake sandbox\n"] * 24
                assert fwd.accepted == 24
            sock = await sb.connect_port(8000)
            reader, writer = await asyncio.open_connection(sock=sock)
            writer.write(b"GET /big.bin HTTP/1.0\r\n\r\n")
            writer.write_eof()
            answer = await reader.read()
            writer.close()
            assert answer.endswith(bytes(range(256)) * 8192)
            with pytest.raises(PortNotListeningError):
                await sb.connect_port(9)
            await sb.delete()

    asyncio.run(main())


def test_async_close_with_connections_open_is_quiet(fake: FakeOrchard) -> None:
    """close() resets the connections still open without asyncio reporting each cancelled
    handler as an error (Python 3.11's start_server logs "Exception in callback" for a
    handler task that ends cancelled)."""
    reported: list[dict[str, object]] = []

    async def main() -> None:
        asyncio.get_running_loop().set_exception_handler(lambda _loop, ctx: reported.append(ctx))
        held = socket.socket()
        held.bind(("127.0.0.1", 0))
        held.listen()
        async with fake.async_client() as client:
            sb = await client.sandboxes.create()
            fake.map_port(sb.id, 8000, held.getsockname()[:2])
            fwd = await sb.forward_port(8000)
            conns = [await asyncio.open_connection("127.0.0.1", fwd.local_port) for _ in range(3)]
            for _ in range(100):  # the relays are open once the fake accepted them
                if fwd.connections == 3:
                    break
                await asyncio.sleep(0.02)
            assert fwd.connections == 3
            await fwd.close()
            for reader, writer in conns:
                with contextlib.suppress(ConnectionResetError):  # the forward resets them
                    assert await reader.read() == b""
                writer.close()
            assert fwd.connections == 0
            await sb.delete()
        await asyncio.sleep(0.05)  # done callbacks run on the next loop turns
        held.close()

    asyncio.run(main())
    assert reported == []
