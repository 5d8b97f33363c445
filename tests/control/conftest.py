"""Fixtures: a real scheduler and gateway (real gRPC servers on free ports, real SQLite).

Both run in-process on one asyncio loop in a background thread, so a test can
hand the scheduler a backend object (the stand-in ``FakeBackend`` or the real
``local`` backend) and talk to the gateway with the plain sync gRPC client.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import grpc
import pytest
from orchard.gateway.server import RunningGateway
from orchard.gateway.server import start as start_gateway
from orchard.gateway.settings import GatewaySettings
from orchard.scheduler.backends.base import Backend
from orchard.scheduler.server import RunningScheduler
from orchard.scheduler.server import start as start_scheduler
from orchard.scheduler.settings import SchedulerSettings

from orchard._proto.orchard.v1 import sandbox_pb2_grpc
from tests.loop_thread import LoopThread

from .fake_backend import FakeBackend

T = TypeVar("T")


@dataclass
class ControlPlane:
    home: Path
    loop: LoopThread
    backend: Backend
    settings: SchedulerSettings
    scheduler: RunningScheduler
    gateway: RunningGateway
    api_key: str
    channel: grpc.Channel

    @property
    def stub(self) -> sandbox_pb2_grpc.SandboxServiceStub:
        return sandbox_pb2_grpc.SandboxServiceStub(self.channel)

    def auth(self, key: str | None = None) -> tuple[tuple[str, str], ...]:
        return (("authorization", f"Bearer {key or self.api_key}"),)

    def stop(self) -> None:
        self.channel.close()
        self.loop.run(self.gateway.stop(1))
        self.loop.run(self.scheduler.stop(self.settings))


def start_control_plane(
    home: Path, backend: Backend, make_settings: Callable[[Path], SchedulerSettings] | None = None
) -> ControlPlane:
    loop = LoopThread()
    settings = (
        make_settings(home)
        if make_settings
        else SchedulerSettings(home=home, executor_address="127.0.0.1:1", reap_interval_seconds=0.2)
    )
    scheduler = loop.run(start_scheduler(settings, backend=backend))
    gateway = loop.run(
        start_gateway(GatewaySettings(home=home, scheduler=scheduler.address, listen="127.0.0.1:0"))
    )
    api_key = (home / "dev-api-key").read_text().strip()
    channel = grpc.insecure_channel(gateway.address)
    return ControlPlane(home, loop, backend, settings, scheduler, gateway, api_key, channel)


@pytest.fixture
def fake_backend() -> FakeBackend:
    return FakeBackend()


@pytest.fixture
def plane(tmp_path: Path, fake_backend: FakeBackend) -> Iterator[ControlPlane]:
    cp = start_control_plane(tmp_path, fake_backend)
    try:
        yield cp
    finally:
        cp.stop()
        cp.loop.close()
