"""The scheduler and gateway over the real ``local`` backend (runc containers).

Same in-process servers as the other control tests, but the backend is the
real one, loaded by name as ``orchard.scheduler`` does, with the shared
images folder (ORCHARD_IMAGES_DIR, default /var/lib/orchard/images).
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from orchard.executor.initbin import ensure_init_binary
from orchard.scheduler.backends.base import Backend, SandboxSpec
from orchard.scheduler.backends.registry import load_backend
from orchard.scheduler.settings import SchedulerSettings
from orchard.scheduler.store import State

from orchard._proto.orchard.v1 import sandbox_pb2

from .conftest import ControlPlane, start_control_plane
from .rpc import code, trailers

IMAGES_DIR = Path(os.environ.get("ORCHARD_IMAGES_DIR") or "/var/lib/orchard/images")

pytestmark = [
    pytest.mark.runc,
    pytest.mark.skipif(
        os.geteuid() != 0 or shutil.which("runc") is None, reason="needs root and runc"
    ),
    pytest.mark.skipif(
        not any(IMAGES_DIR.glob("*/image.json")), reason=f"no image in {IMAGES_DIR}"
    ),
]


def _settings(home: Path) -> SchedulerSettings:
    return SchedulerSettings(
        home=home,
        executor_address="127.0.0.1:1",
        images_dir=IMAGES_DIR,
        init_binary=ensure_init_binary(),
        delete_all_on_shutdown=True,
    )


def _backend(home: Path) -> Backend:
    return load_backend("local", _settings(home))


@pytest.fixture
def real_plane(tmp_path: Path) -> Iterator[ControlPlane]:
    plane = start_control_plane(tmp_path, _backend(tmp_path), _settings)
    try:
        yield plane
    finally:
        plane.stop()
        plane.loop.close()


def _backend_ids(plane: ControlPlane) -> set[str]:
    return {b.sandbox_id for b in plane.loop.run(plane.backend.list())}


def test_create_get_delete_with_real_containers(real_plane: ControlPlane) -> None:
    stub, auth = real_plane.stub, real_plane.auth()
    sb = stub.CreateSandbox(sandbox_pb2.CreateSandboxRequest(labels={"t": "real"}), metadata=auth)
    assert sb.state == sandbox_pb2.READY
    assert sb.id in _backend_ids(real_plane)
    assert (real_plane.home / "sandboxes" / sb.id).is_dir()
    images = stub.ListImages(sandbox_pb2.ListImagesRequest(), metadata=auth).images
    assert any(i.is_default for i in images)
    stub.DeleteSandbox(sandbox_pb2.DeleteSandboxRequest(id=sb.id), metadata=auth)
    # The delete answers at DELETING; the teardown finishes in the background.
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        got = stub.GetSandbox(sandbox_pb2.GetSandboxRequest(id=sb.id), metadata=auth)
        if got.state == sandbox_pb2.DELETED:
            break
        assert got.state == sandbox_pb2.DELETING
        time.sleep(0.02)
    assert sb.id not in _backend_ids(real_plane)
    assert not (real_plane.home / "sandboxes" / sb.id).exists()


def test_unknown_image_fails_as_client_fault(real_plane: ControlPlane) -> None:
    with pytest.raises(grpc.RpcError) as info:
        real_plane.stub.CreateSandbox(
            sandbox_pb2.CreateSandboxRequest(image="no-such-image"), metadata=real_plane.auth()
        )
    assert code(info.value) == grpc.StatusCode.NOT_FOUND
    assert trailers(info.value) == {"orchard-reason": "IMAGE_NOT_FOUND", "orchard-fault": "client"}
    assert _backend_ids(real_plane) == set()


def test_recovery_removes_orphans_and_keeps_live_sandboxes(tmp_path: Path) -> None:
    plane = start_control_plane(
        tmp_path,
        _backend(tmp_path),
        lambda h: SchedulerSettings(home=h, executor_address="127.0.0.1:1", images_dir=IMAGES_DIR),
    )
    kept = plane.stub.CreateSandbox(sandbox_pb2.CreateSandboxRequest(), metadata=plane.auth())
    plane.stop()  # no delete-all: the container outlives the scheduler, as after a crash
    plane.loop.run(plane.backend.create(SandboxSpec(sandbox_id="sb-orphan000000")))
    plane.loop.close()

    plane = start_control_plane(tmp_path, _backend(tmp_path), _settings)
    try:
        assert _backend_ids(plane) == {kept.id}
        rec = plane.scheduler.store.get(kept.id)
        assert rec is not None and rec.state == State.READY
    finally:
        plane.stop()
        plane.loop.close()
    assert list((tmp_path / "sandboxes").iterdir()) == []
