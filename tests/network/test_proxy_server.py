"""The egress proxy as the chart runs it (``python -m ...netpolicy.proxy_server``): a real
process on loopback reading its table from a folder, as it reads the mounted ConfigMap.

Only refusals are exercised: an allowed destination would mean connecting
somewhere other than loopback (the local suite, tests/network/test_local_policy.py,
covers allowed traffic through the same proxy code with test hosts in its own
network namespaces).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from orchard.scheduler.backends.netpolicy.k8s import proxy_table_entry
from orchard.scheduler.backends.netpolicy.policy import build_policy

MODULE = "orchard.scheduler.backends.netpolicy.proxy_server"


@pytest.fixture
def proxy(tmp_path: Path) -> Iterator[tuple[int, Path]]:
    table = tmp_path / "table"
    table.mkdir()
    process = subprocess.Popen(
        [sys.executable, "-m", MODULE, "--table-dir", str(table), "--bind", "127.0.0.1",
         "--port", "0", "--dns-port", "0", "--upstream", "127.0.0.1:9", "--poll-seconds", "0.05"],
        stdout=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )  # fmt: skip
    try:
        assert process.stdout is not None
        line = process.stdout.readline().decode().split()
        assert line[:1] == ["proxy"], line
        yield int(line[1]), table
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        if process.stdout is not None:
            process.stdout.close()


def ask(port: int, head: str) -> bytes:
    """Send a request head; the answer, or b"" when the proxy hangs up without one."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as conn:
        conn.sendall(head.encode())
        chunks = []
        while True:
            try:
                data = conn.recv(4096)
            except ConnectionResetError:
                break
            if not data:
                break
            chunks.append(data)
        return b"".join(chunks)


def until(port: int, head: str, wanted: bytes, timeout: float = 5.0) -> bytes:
    deadline = time.monotonic() + timeout
    answer = b""
    while time.monotonic() < deadline:
        answer = ask(port, head)
        if wanted in answer or (not wanted and not answer):
            return answer
        time.sleep(0.05)
    raise AssertionError(f"never got {wanted!r}; last answer {answer!r}")


CONNECT_DENIED = "CONNECT denied.test:443 HTTP/1.1\r\nHost: denied.test:443\r\n\r\n"


def test_the_table_folder_decides_who_the_proxy_serves(proxy: tuple[int, Path]) -> None:
    port, table = proxy
    # Not in the table: the proxy answers nothing at all.
    assert ask(port, CONNECT_DENIED) == b""
    policy = build_policy("allowlist", [], [443], ["allowed.test"])
    (table / "sb-a.json").write_text(proxy_table_entry("127.0.0.1", policy))
    answer = until(port, CONNECT_DENIED, b"403")
    assert b"not in this sandbox's allowlist" in answer
    forged = "CONNECT allowed.test:443 HTTP/1.1\r\nHost: denied.test:443\r\n\r\n"
    assert b"Host header does not match" in ask(port, forged)
    wrong_port = "CONNECT allowed.test:22 HTTP/1.1\r\n\r\n"
    assert b"port 22 is not allowed" in ask(port, wrong_port)
    # Broken and hostile files next to it are ignored, not fatal.
    (table / "sb-b.json").write_text("{not json")
    (table / "sb-c.json").write_text(json.dumps({"address": "127.0.0.1; rm", "policy": {}}))
    assert b"403" in ask(port, CONNECT_DENIED)
    # The entry goes (the sandbox was deleted): the proxy forgets the client.
    (table / "sb-a.json").unlink()
    until(port, CONNECT_DENIED, b"")
