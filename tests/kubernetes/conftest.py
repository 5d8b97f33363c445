"""Fixtures for the Kubernetes backend tests: a FAKE API server on loopback (see fake_apiserver)."""

from __future__ import annotations

import secrets
from collections.abc import Iterator

import pytest
from orchard.scheduler.backends.kubernetes import KubernetesBackend, KubernetesSettings, PodTemplate

from orchard.common.tokens import Keyring

from .fake_apiserver import FakeApiServer

NAMESPACE = "orchard-sandboxes"


@pytest.fixture
def fake_api() -> Iterator[FakeApiServer]:
    server = FakeApiServer().start()
    try:
        yield server
    finally:
        server.stop()


def random_keyring() -> Keyring:
    """A node keyring of one random key, for backend tests that sign no tokens."""
    return Keyring.single(secrets.token_bytes(32))


def fake_settings(server: FakeApiServer, **overrides: object) -> KubernetesSettings:
    base: dict[str, object] = {
        "namespace": NAMESPACE,
        "api_host": server.url,
        "ready_timeout_seconds": 10.0,
        "watch_timeout_seconds": 5,
        "request_timeout_seconds": 5.0,
        "max_retry_after_seconds": 2.0,
        "templates": {
            "py": PodTemplate(
                name="py", image="python:3.11-slim", cpu_millis=250, memory_bytes=256 << 20
            )
        },
    }
    base.update(overrides)
    return KubernetesSettings(**base)  # type: ignore[arg-type]


async def started_backend(server: FakeApiServer, **overrides: object) -> KubernetesBackend:
    backend = KubernetesBackend(fake_settings(server, **overrides), keyring=random_keyring())
    await backend.start()
    return backend
