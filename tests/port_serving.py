"""Servers inside a sandbox, reached through port forwarding (shared by the ports tests).

The same check runs on every data-plane path (the node executor, an injected
executor, gVisor, the gateway's nginx proxy): a real ``http.server`` in the
sandbox, fetched concurrently through ``forward_port``, and a closed port
refused as ``PortNotListeningError``.
"""

from __future__ import annotations

import concurrent.futures
import time
import urllib.request

import pytest

from orchard import PortNotListeningError, Sandbox


def start_server(
    sb: Sandbox, command: str, port: int, host: str = "127.0.0.1", wait: float = 20.0
) -> None:
    """Start a server in the background inside ``sb`` and wait until ``port`` accepts."""
    sb.exec(f"setsid sh -c '{command}' >/tmp/server-{port}.log 2>&1 </dev/null &", timeout=10)
    deadline = time.monotonic() + wait
    while True:
        try:
            sb.connect_port(port, host=host).close()
            return
        except PortNotListeningError:
            if time.monotonic() > deadline:
                log = sb.exec(f"cat /tmp/server-{port}.log").stdout_text
                raise AssertionError(f"port {port} never listened: {log}") from None
            time.sleep(0.1)


def check_http_through_forward(
    sb: Sandbox, name: str, body: bytes, *, fetches: int, threads: int, wait: float = 20.0
) -> None:
    """Serve ``/srv`` (where the caller put ``name`` = ``body``) and fetch it ``fetches`` times."""
    start_server(
        sb, "python3 -m http.server 8000 --bind 127.0.0.1 --directory /srv", 8000, wait=wait
    )
    with sb.forward_port(8000) as fwd, concurrent.futures.ThreadPoolExecutor(threads) as pool:

        def fetch(_: int) -> bytes:
            with urllib.request.urlopen(f"{fwd.url}/{name}", timeout=30) as r:
                return bytes(r.read())

        assert list(pool.map(fetch, range(fetches))) == [body] * fetches
    with pytest.raises(PortNotListeningError):
        sb.connect_port(9)
