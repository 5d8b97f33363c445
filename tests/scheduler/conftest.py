"""Fixtures for the warm pool and lifecycle tests.

``pool_plane`` is a real scheduler (real gRPC server on a free port, real
SQLite, its own asyncio loop in a thread) over ``EnvFakeBackend``, a STAND-IN
backend that makes no containers (tests/control/fake_backend.py plus
``update_env``), with a templates.toml in its home. Tests call the scheduler
directly with the ``orchard-tenant`` metadata the gateway would set (the
gateway's own forwarding is tested with it). The runc-marked tests
(test_*_runc.py) use real containers and real processes instead.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, TypeVar

import grpc
import pytest
from orchard.scheduler.backends.base import UPDATE_ENV, Backend, BackendError, Capability
from orchard.scheduler.server import RunningScheduler
from orchard.scheduler.server import start as start_scheduler
from orchard.scheduler.settings import PoolSettings, SchedulerSettings

from orchard._proto.orchard.v1 import pools_pb2_grpc, sandbox_pb2_grpc
from orchard.common.internal_pki import InternalPKI
from tests.control.fake_backend import FakeBackend
from tests.loop_thread import LoopThread

T = TypeVar("T")


@dataclass
class ControlPlane:
    home: Path
    loop: LoopThread
    backend: Backend
    settings: SchedulerSettings
    scheduler: RunningScheduler
    channel: grpc.Channel

    @property
    def stub(self) -> sandbox_pb2_grpc.SandboxServiceStub:
        return sandbox_pb2_grpc.SandboxServiceStub(self.channel)

    @property
    def pools(self) -> pools_pb2_grpc.PoolServiceStub:
        return pools_pb2_grpc.PoolServiceStub(self.channel)

    def auth(self, tenant: str = "alice") -> tuple[tuple[str, str], ...]:
        return (("orchard-tenant", tenant),)

    def stop(self) -> None:
        self.channel.close()
        self.loop.run(self.scheduler.stop(self.settings))


def start_control_plane(
    home: Path, backend: Backend, make_settings: Callable[[Path], SchedulerSettings]
) -> ControlPlane:
    loop = LoopThread()
    settings = make_settings(home)
    scheduler = loop.run(start_scheduler(settings, backend=backend))
    # The scheduler admits only the gateway (mutual TLS); the tests call it as the gateway.
    channel = InternalPKI.of_home(home).identity("gateway").channel("scheduler", scheduler.address)
    return ControlPlane(home, loop, backend, settings, scheduler, channel)


TEMPLATES = """
[templates.small]
cpu_millis = 500
memory_bytes = 268435456
env = { BASE = "from-template", OVERRIDE = "template" }
min = 4
max = 60

[templates.empty]
min = 0
max = 20
"""


class EnvFakeBackend(FakeBackend):
    """The stand-in backend, plus the env update a claim needs (recorded, not applied)."""

    capabilities: frozenset[Capability[Any]] = frozenset({UPDATE_ENV})

    def __init__(self, create_delay: float = 0.0) -> None:
        super().__init__(create_delay=create_delay)
        self.env_updates: dict[str, dict[str, str]] = {}
        self.broken: set[str] = set()

    async def update_env(self, sandbox_id: str, env: dict[str, str]) -> None:
        if sandbox_id in self.broken or sandbox_id not in self.sandboxes:
            raise BackendError.failure(f"sandbox {sandbox_id}: its init is not running")
        spec = self.sandboxes[sandbox_id]
        self.sandboxes[sandbox_id] = replace(spec, env={**spec.env, **env})
        self.env_updates[sandbox_id] = dict(env)


def pool_settings(home: Path, **pools: float) -> SchedulerSettings:
    return SchedulerSettings(
        home=home,
        executor_address="127.0.0.1:1",
        reap_interval_seconds=0.2,
        pools=PoolSettings(tick_seconds=0.05, **pools),  # type: ignore[arg-type]
    )


def start_pool_plane(
    home: Path,
    backend: FakeBackend,
    templates: str = TEMPLATES,
    make_settings: Callable[[Path], SchedulerSettings] = pool_settings,
) -> ControlPlane:
    (home / "templates.toml").write_text(templates)
    return start_control_plane(home, backend, make_settings)


@pytest.fixture
def env_backend() -> EnvFakeBackend:
    return EnvFakeBackend()


@pytest.fixture
def pool_plane(tmp_path: Path, env_backend: EnvFakeBackend) -> Iterator[ControlPlane]:
    plane = start_pool_plane(tmp_path, env_backend)
    try:
        yield plane
    finally:
        plane.stop()
        plane.loop.close()
