"""The model proxy as a real process (``python -m orchard.modelproxy``) between a scripted
upstream and the real ``openai`` / ``anthropic`` clients."""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from orchard.testing.scripted_model import ScriptedUpstream, scripted_upstream

from .tenant_gateway import tenant_gateway

KEYS = {"key-alice": "alice", "key-bob": "bob"}


@dataclass
class Proxy:
    home: Path
    url: str
    process: subprocess.Popen[bytes]
    args: list[str] = field(default_factory=list)

    def call(self, method: str, path: str, body: Any = None, key: str | None = "key-alice",
             headers: dict[str, str] | None = None) -> tuple[int, Any]:  # fmt: skip
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(self.url + path, data=data, method=method)
        request.add_header("Content-Type", "application/json")
        if key:
            request.add_header("Authorization", f"Bearer {key}")
        for name, value in (headers or {}).items():
            request.add_header(name, value)
        try:
            with urllib.request.urlopen(request, timeout=30) as response:
                raw, status = response.read(), response.status
                kind = response.headers.get("Content-Type", "")
        except urllib.error.HTTPError as err:
            raw, status, kind = err.read(), err.code, err.headers.get("Content-Type", "")
        if kind.startswith("application/json"):
            return status, json.loads(raw)
        return status, raw.decode()

    def session(self, key: str = "key-alice", **body: Any) -> dict[str, Any]:
        status, answer = self.call("POST", "/v1/sessions", body, key=key)
        assert status == 200, answer
        return dict(answer)

    def records(self, session_id: str, key: str = "key-alice") -> list[dict[str, Any]]:
        status, text = self.call("GET", f"/v1/sessions/{session_id}/calls", key=key)
        assert status == 200, text
        return [json.loads(line) for line in text.splitlines() if line]


def start_proxy(home: Path, upstream_url: str, gateway: str, *extra: str) -> Proxy:
    args = ["--home", str(home), "--listen", "127.0.0.1:0", "--upstream", upstream_url,
            "--gateway", gateway, *extra]  # fmt: skip
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    with open(home / "modelproxy.log", "ab") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "orchard.modelproxy", *args],
            stdout=subprocess.PIPE, stderr=log, env=env,
        )  # fmt: skip
    assert process.stdout is not None
    ready, _, _ = select.select([process.stdout], [], [], 30)
    line = process.stdout.readline().decode().strip() if ready else ""
    if not line.startswith(("http://", "https://")):
        process.kill()
        process.wait()
        process.stdout.close()
        raise AssertionError(
            f"proxy did not start: {(home / 'modelproxy.log').read_text()[-3000:]}"
        )
    return Proxy(home, line, process, args)


def stop_proxy(proxy: Proxy) -> None:
    if proxy.process.poll() is None:
        proxy.process.send_signal(signal.SIGTERM)
        try:
            proxy.process.wait(15)
        except subprocess.TimeoutExpired:
            proxy.process.kill()
            proxy.process.wait()
    if proxy.process.stdout is not None:
        proxy.process.stdout.close()


@pytest.fixture
def gateway() -> Iterator[str]:
    with tenant_gateway(KEYS) as address:
        yield address


@pytest.fixture
def upstream() -> Iterator[tuple[ScriptedUpstream, str]]:
    with scripted_upstream([]) as pair:
        yield pair


@pytest.fixture
def proxy(tmp_path: Path, upstream: tuple[ScriptedUpstream, str], gateway: str) -> Iterator[Proxy]:
    started = start_proxy(
        tmp_path, upstream[1], gateway, "--max-body-bytes", "65536", "--body-timeout-seconds", "2"
    )
    try:
        yield started
    finally:
        stop_proxy(started)
        time.sleep(0)
