"""Port forwarding: connection setup and throughput through the forward, vs direct loopback.

One small TCP server (below) runs twice: inside a sandbox (policy ``none``) on
its loopback, reached through ``Sandbox.forward_port`` (and ``connect_port``),
and on this machine's loopback as the baseline every forwarded figure is set
beside. Measured, through the public SDK (sync face):

- ``setup_ms``: connect, send one byte, read the server's one-byte answer,
  close (N sequential): what a new HTTP connection costs before its request;
- ``download_mib_s`` / ``upload_mib_s``: one connection moving ``--mib`` MiB
  out of / into the server;
- ``parallel_download_mib_s``: ``--parallel`` connections at once, summed.

    .venv/bin/python loadtest/bench_ports.py [--n 300] [--mib 256] [--parallel 8]

(starts its own ``orchard up`` in a temporary home; prints JSON).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from loadtest.peer_swerex import percentiles
from orchard import Orchard, PortNotListeningError, Sandbox

PORT = 9500
CHUNK = 1 << 20
SERVER = r"""
import socket, sys, threading
CHUNK = 1 << 20
def serve(c):
    with c:
        head = c.recv(9, socket.MSG_WAITALL)
        mode, n = head[:1], int.from_bytes(head[1:9], "little")
        if mode == b"p":
            c.sendall(b"k")
        elif mode == b"d":
            block = b"\x5a" * CHUNK
            while n > 0:
                c.sendall(block[: min(n, CHUNK)])
                n -= CHUNK
        elif mode == b"u":
            got = 0
            while data := c.recv(CHUNK):
                got += len(data)
            c.sendall(got.to_bytes(8, "little"))
s = socket.create_server(("127.0.0.1", int(sys.argv[1])), backlog=1024)
print("ready", flush=True)
while True:
    c, _ = s.accept()
    threading.Thread(target=serve, args=(c,), daemon=True).start()
"""

Connect = Callable[[], socket.socket]


def _header(mode: bytes, n: int = 0) -> bytes:
    return mode + n.to_bytes(8, "little")


def setup_ms(connect: Connect, n: int) -> dict[str, float]:
    samples = []
    for i in range(n + 20):
        t0 = time.perf_counter()
        with connect() as sock:
            sock.sendall(_header(b"p"))
            assert sock.recv(1) == b"k"
        if i >= 20:  # warm-up
            samples.append((time.perf_counter() - t0) * 1000)
    return percentiles(samples)


def download(connect: Connect, size: int) -> int:
    with connect() as sock:
        sock.sendall(_header(b"d", size))
        got = 0
        while data := sock.recv(CHUNK):
            got += len(data)
    assert got == size, (got, size)
    return got


def upload(connect: Connect, size: int) -> int:
    block = b"\xa5" * CHUNK
    with connect() as sock:
        sock.sendall(_header(b"u"))
        left = size
        while left > 0:
            sock.sendall(block[: min(left, CHUNK)])
            left -= CHUNK
        sock.shutdown(socket.SHUT_WR)
        got = int.from_bytes(sock.recv(8, socket.MSG_WAITALL), "little")
    assert got == size, (got, size)
    return got


def mib_s(fn: Callable[[], int]) -> float:
    t0 = time.perf_counter()
    moved = fn()
    return round(moved / (1 << 20) / (time.perf_counter() - t0), 1)


def parallel(connect: Connect, size: int, k: int) -> float:
    def one(_: int) -> int:
        return download(connect, size // k)

    def all_of_them() -> int:
        with concurrent.futures.ThreadPoolExecutor(k) as pool:
            return sum(pool.map(one, range(k)))

    return mib_s(all_of_them)


def figures(connect: Connect, n: int, mib: int, k: int) -> dict[str, Any]:
    size = mib << 20
    download(connect, 8 << 20)  # warm-up
    return {
        "setup_ms": setup_ms(connect, n),
        "download_mib_s": mib_s(lambda: download(connect, size)),
        "upload_mib_s": mib_s(lambda: upload(connect, size)),
        "parallel_download_mib_s": parallel(connect, size, k),
    }


def _wait_listening(sb: Sandbox) -> None:
    deadline = time.monotonic() + 20
    while True:
        try:
            sb.connect_port(PORT).close()
            return
        except PortNotListeningError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--n", type=int, default=300, help="sequential connections timed")
    parser.add_argument("--mib", type=int, default=256, help="MiB per throughput run")
    parser.add_argument("--parallel", type=int, default=8, help="connections at once")
    args = parser.parse_args()
    from tests.stack import running_stack

    with tempfile.TemporaryDirectory(prefix="orchard-bench-ports-") as tmp:
        script = Path(tmp) / "server.py"
        script.write_text(SERVER)
        probe = socket.create_server(("127.0.0.1", 0))
        host_port = probe.getsockname()[1]
        probe.close()
        local = subprocess.Popen(
            [sys.executable, str(script), str(host_port)], stdout=subprocess.PIPE, text=True
        )
        try:
            assert local.stdout is not None and local.stdout.readline() == "ready\n"
            result: dict[str, Any] = {
                "direct_loopback": figures(
                    lambda: socket.create_connection(("127.0.0.1", host_port)),
                    args.n,
                    args.mib,
                    args.parallel,
                )
            }
            with running_stack(Path(tmp) / "home") as stack:
                key = (stack.home / "dev-api-key").read_text().strip()
                with (
                    Orchard(stack.endpoint, key) as client,
                    client.sandboxes.create(network="none", memory="1Gi", cpu=1.0) as sb,
                ):
                    sb.write_file("/opt/server.py", SERVER)
                    sb.exec(
                        f"setsid python3 /opt/server.py {PORT} >/tmp/server.log 2>&1 </dev/null &"
                    )
                    _wait_listening(sb)
                    with sb.forward_port(PORT) as fwd:
                        address = fwd.local_address
                        result["forward_port"] = figures(
                            lambda: socket.create_connection(address),
                            args.n,
                            args.mib,
                            args.parallel,
                        )
                    result["connect_port_setup_ms"] = setup_ms(
                        lambda: sb.connect_port(PORT), args.n
                    )
        finally:
            local.kill()
            local.wait()
            if local.stdout is not None:
                local.stdout.close()
    result["params"] = {"n": args.n, "mib": args.mib, "parallel": args.parallel}
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
