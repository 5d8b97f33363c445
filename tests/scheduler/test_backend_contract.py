"""The backend contract (``backends.base``): a backend's capabilities are what it declares.

Uses the stand-in backend of tests/control (no containers); the real backends'
declarations are checked against their methods here too.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from orchard.scheduler.backends.base import (
    CHECK_RUNTIME_CLASS,
    CLOSE,
    MODEL_ENDPOINT,
    POOL_STATE,
    PUSHES_REVOCATIONS,
    REPORT_FAILURES,
    UPDATE_ENV,
    UPDATE_NETWORK,
    BackendError,
    Capability,
    check_capabilities,
    supports,
)
from orchard.scheduler.backends.kubernetes import KubernetesBackend, KubernetesSettings
from orchard.scheduler.backends.local.backend import LocalBackend
from orchard.scheduler.backends.local.settings import LocalSettings
from orchard.scheduler.lifecycle import SandboxLifecycle
from orchard.scheduler.settings import SchedulerSettings
from orchard.scheduler.store import SandboxStore

from orchard.common.tokens import Keyring, TokenSigner
from tests.control.fake_backend import FakeBackend


class _Undeclared(FakeBackend):
    """Has the methods of two capabilities but declares neither: they must not be used."""

    def __init__(self) -> None:
        super().__init__()
        self.closed = False

    def check_runtime_class(self, runtime_class: str) -> None:
        raise AssertionError("an undeclared capability was used")

    async def close(self) -> None:
        self.closed = True


class _Lying(FakeBackend):
    capabilities: frozenset[Capability[Any]] = frozenset({UPDATE_ENV, REPORT_FAILURES})

    async def failure(self, sandbox_id: str) -> None:
        return None


def test_supports_goes_by_the_declaration_not_by_method_names() -> None:
    backend = _Undeclared()
    assert supports(backend, CHECK_RUNTIME_CLASS) is None
    assert supports(backend, CLOSE) is None
    lying = _Lying()
    assert supports(lying, REPORT_FAILURES) is lying


def test_a_declaration_without_its_methods_is_refused_at_start(tmp_path: Path) -> None:
    with pytest.raises(
        TypeError, match="the fake backend declares update_env but has no update_env"
    ):
        check_capabilities(_Lying())
    store = SandboxStore(tmp_path / "state.db")
    try:
        with pytest.raises(TypeError, match="declares update_env"):
            SandboxLifecycle(
                store, _Lying(), TokenSigner(b"k" * 32), SchedulerSettings(home=tmp_path)
            )
    finally:
        store.close()


def test_the_real_backends_declare_what_they_implement(tmp_path: Path) -> None:
    local = LocalBackend(LocalSettings(home=tmp_path, sandbox_disk_bytes=0, userns=False))
    kube = KubernetesBackend(
        KubernetesSettings(api_host="http://127.0.0.1:1"), keyring=Keyring.single(b"k" * 32)
    )
    for backend in (local, kube):
        check_capabilities(backend)
    assert local.capabilities == {
        UPDATE_ENV,
        UPDATE_NETWORK,
        REPORT_FAILURES,
        CHECK_RUNTIME_CLASS,
        MODEL_ENDPOINT,
        CLOSE,
    }
    # Kubernetes tells its pods of revocations itself; the scheduler tells local sandboxes.
    assert kube.capabilities == {
        POOL_STATE,
        UPDATE_NETWORK,
        REPORT_FAILURES,
        CLOSE,
        PUSHES_REVOCATIONS,
    }


def test_the_local_backend_refuses_a_model_endpoint_under_runsc(tmp_path: Path) -> None:
    """gVisor's netstack is in its Sentry: a listener made in the host namespace the sandbox
    runs in would not be on the loopback its processes see (local/model_endpoint.py)."""
    # userns=False: a disk-backed writable layer (sandbox_disk_bytes=0) cannot carry them.
    local = LocalBackend(LocalSettings(home=tmp_path, sandbox_disk_bytes=0, userns=False))
    with pytest.raises(BackendError, match="'runsc' cannot have a model endpoint") as refused:
        local.check_model_endpoint("runsc")
    assert refused.value.client_fault
    local.check_model_endpoint("runc")  # and the node executor's sandboxes can
