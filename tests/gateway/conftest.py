"""One real ``orchard up`` for the gateway suite (real processes, runc, SQLite, HTTP).

The stack runs with ``ORCHARD_TRACE_FILE`` set, so every service appends its
finished spans to ``<home>/traces.jsonl`` and a test can follow one trace
across the gateway, scheduler and executor processes. Tenants are made with
the real ``orchard tenant`` CLI.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest

from orchard._proto.orchard.v1 import sandbox_pb2_grpc
from tests.stack import REQUIRES_STACK, Stack, running_stack


@dataclass
class GatewayStack:
    stack: Stack
    channel: grpc.Channel

    @property
    def home(self) -> Path:
        return self.stack.home

    @property
    def endpoint(self) -> str:
        return self.stack.endpoint

    @property
    def http(self) -> str:
        return "http://" + (self.home / "run" / "gateway-http.addr").read_text().strip()

    def metrics_address(self, service: str) -> str:
        return (self.home / "run" / f"{service}.metrics.addr").read_text().strip()

    @property
    def control(self) -> sandbox_pb2_grpc.SandboxServiceStub:
        return sandbox_pb2_grpc.SandboxServiceStub(self.channel)

    def tenant(self, *args: str) -> subprocess.CompletedProcess[str]:
        result = subprocess.run(
            [sys.executable, "-m", "orchard.cli", "tenant", "--home", str(self.home), *args],
            capture_output=True,
            text=True,
            timeout=60,
            stdin=subprocess.DEVNULL,
        )
        assert "Traceback" not in result.stderr, result.stderr
        return result

    def new_tenant(self, name: str, **quota: float) -> str:
        made = self.tenant("create", name)
        assert made.returncode == 0, made.stderr
        if quota:
            set_quota = self.tenant("quota", name, *(f"{k}={v}" for k, v in quota.items()))
            assert set_quota.returncode == 0, set_quota.stderr
        return made.stdout.strip()


@pytest.fixture(scope="package")
def gw() -> Iterator[GatewayStack]:
    for mark in REQUIRES_STACK:
        if mark.name == "skipif" and mark.args[0]:
            pytest.skip(mark.kwargs["reason"])
    with tempfile.TemporaryDirectory(prefix="orchard-gw-") as tmp:
        home = Path(tmp) / "home"
        home.mkdir()
        saved = os.environ.get("ORCHARD_TRACE_FILE")
        os.environ["ORCHARD_TRACE_FILE"] = str(home / "traces.jsonl")
        try:
            with running_stack(home) as stack, grpc.insecure_channel(stack.endpoint) as channel:
                yield GatewayStack(stack, channel)
        finally:
            if saved is None:
                os.environ.pop("ORCHARD_TRACE_FILE", None)
            else:
                os.environ["ORCHARD_TRACE_FILE"] = saved
