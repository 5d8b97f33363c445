"""The local backend's runsc runtime class, driven directly (real runsc, real cgroups).

What the stack test does not reach: the refusals with their reasons (no
executor bundle, a networked policy gVisor cannot be given here), and a new
backend object (a restarted scheduler) finding a running runsc sandbox in
runsc's state and deleting it without leaving anything behind.
"""

from __future__ import annotations

import asyncio
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from orchard.executor.initbin import ensure_init_binary
from orchard.scheduler.backends.base import BackendError, SandboxSpec
from orchard.scheduler.backends.local.backend import LocalBackend
from orchard.scheduler.backends.local.settings import LocalSettings
from orchard.scheduler.backends.netpolicy.policy import NetworkPolicySpec

from tests.runtime.runtime_helpers import cgroup_dirs, force_cleanup_home, mounts_under

from .runsc_footprint import force_delete_runsc, runsc_pids, runsc_state_files

pytestmark = [
    pytest.mark.runc,
    pytest.mark.skipif(shutil.which("runsc") is None, reason="needs gVisor's runsc (Debian runsc)"),
]

SANDBOX_ID = "sb-runsc-backend-1"


@pytest.fixture
def home() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="oe-runsc-", dir="/tmp"))
    try:
        yield path
    finally:
        force_delete_runsc(path)
        force_cleanup_home(path)


def backend(home: Path, images_dir: Path, bundle: Path | None) -> LocalBackend:
    return LocalBackend(
        LocalSettings(
            home=home,
            images_dir=images_dir,
            init_binary=ensure_init_binary(),
            executor_bundle=bundle,
        )
    )


def test_runsc_needs_a_bundle_and_network_none(home: Path, images_dir: Path, bundle: Path) -> None:
    no_bundle = backend(home, images_dir, None)
    with pytest.raises(BackendError, match="needs an executor bundle") as err:
        no_bundle.check_runtime_class("runsc")
    assert err.value.reason == "UNSUPPORTED" and err.value.client_fault
    with_bundle = backend(home, images_dir, bundle)
    with_bundle.check_runtime_class("runsc")
    spec = SandboxSpec(
        sandbox_id=SANDBOX_ID,
        runtime_class="runsc",
        network_mode="internet",
        network=NetworkPolicySpec(mode="internet"),
    )
    with pytest.raises(BackendError, match="network mode 'none' only") as err:
        asyncio.run(with_bundle.create(spec))
    assert err.value.reason == "UNSUPPORTED"
    assert not (home / "sandboxes" / SANDBOX_ID).exists()
    assert runsc_state_files(home, SANDBOX_ID) == []


def test_a_restarted_backend_finds_and_deletes_a_runsc_sandbox(
    home: Path, images_dir: Path, bundle: Path
) -> None:
    first = backend(home, images_dir, bundle)
    created = asyncio.run(first.create(SandboxSpec(sandbox_id=SANDBOX_ID, runtime_class="runsc")))
    assert created.running and created.executor_address.endswith("/run/executor.sock")
    asyncio.run(first.close())
    # A new backend object, as after a scheduler restart: runsc's state tells it all.
    second = backend(home, images_dir, bundle)
    (found,) = asyncio.run(second.list())
    assert (found.sandbox_id, found.running, found.init_pid) == (
        SANDBOX_ID,
        True,
        created.init_pid,
    )
    assert found.executor_address == created.executor_address
    asyncio.run(second.delete(SANDBOX_ID))
    assert asyncio.run(second.list()) == []
    assert runsc_pids(home, SANDBOX_ID) == []
    assert runsc_state_files(home, SANDBOX_ID) == []
    assert cgroup_dirs(SANDBOX_ID) == []
    assert mounts_under(home) == []
    assert not (home / "sandboxes" / SANDBOX_ID).exists()
    asyncio.run(second.close())
