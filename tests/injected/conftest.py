"""Fixtures for the injected runtime: real runc sandboxes that run their own executor.

Each test module gets a node (a temp ORCHARD home, the shared image store)
whose local backend runs in injected mode: the executor bundle (built once,
cached under ``$ORCHARD_HOME/bundles``) is mounted read-only into every
container and the executor inside serves on ``<sandbox>/run/executor.sock``.
Two sandboxes per module (the executor tests' two ids), on the image named by
the ``image`` parameter: the busybox-only image (no libc, no Python, no bash)
or the default Debian image. Everything is deleted at the end, even on failure.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from orchard.executor.bundle import ensure_bundle
from orchard.executor.initbin import ensure_init_binary
from orchard.scheduler.backends.base import SandboxSpec
from orchard.scheduler.backends.local import injected
from orchard.scheduler.backends.local.backend import LocalBackend
from orchard.scheduler.backends.local.images import build_default_image
from orchard.scheduler.backends.local.settings import DEFAULT_IMAGE, LocalSettings

from tests.executor.conftest import OTHER_SANDBOX_ID, SANDBOX_ID
from tests.executor.harness import Client
from tests.runtime.runtime_helpers import force_cleanup_home

from .busybox_image import busybox_is_static, ensure_busybox_image

IMAGES = ("busybox", "debian")
ADD_TEST_USERS = (
    "grep -q '^alice:' /etc/passwd || echo 'alice:x:1000:1000:Alice:/home/alice:/bin/sh' >> /etc/passwd;"
    "grep -q '^alice:' /etc/group || echo 'alice:x:1000:' >> /etc/group;"
    "grep -q '^staff:' /etc/group || echo 'staff:x:50:alice' >> /etc/group;"
    "mkdir -p /home/alice"
)


def _cannot_run() -> str | None:
    if os.geteuid() != 0:
        return "needs root"
    for tool in ("runc", "gcc", "ldd"):
        if shutil.which(tool) is None:
            return f"needs {tool}"
    if not busybox_is_static():
        return "needs Debian's busybox-static (/bin/busybox, statically linked)"
    return None


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    reason = _cannot_run()
    if reason is None:
        return
    for item in items:
        if "runc" in item.keywords and "tests/injected/" in str(item.fspath):
            item.add_marker(pytest.mark.skip(reason=reason))


@pytest.fixture(scope="session")
def images_dir() -> Path:
    path = Path(os.environ.get("ORCHARD_IMAGES_DIR") or "/var/lib/orchard/images")
    build_default_image(path)
    return path


@pytest.fixture(scope="session")
def bundle() -> Path:
    return ensure_bundle()


@pytest.fixture(scope="session")
def image_names(images_dir: Path) -> dict[str, str]:
    return {"busybox": ensure_busybox_image(images_dir), "debian": DEFAULT_IMAGE}


@pytest.fixture(scope="module", params=IMAGES)
def image(request: pytest.FixtureRequest) -> str:
    """Which image the module's sandboxes run: "busybox" or "debian"."""
    return str(request.param)


@dataclass
class InjectedNode:
    home: Path
    backend: LocalBackend
    loop: asyncio.AbstractEventLoop
    image: str

    def create(self, sandbox_id: str, memory_bytes: int = 512 << 20) -> str:
        """Create an injected sandbox; returns its executor's address."""
        spec = SandboxSpec(sandbox_id=sandbox_id, image=self.image, memory_bytes=memory_bytes)
        self.loop.run_until_complete(self.backend.create(spec))
        return self.address(sandbox_id)

    def delete(self, sandbox_id: str) -> None:
        self.loop.run_until_complete(self.backend.delete(sandbox_id))

    def address(self, sandbox_id: str) -> str:
        return injected.executor_address(self.backend.layout.sandbox(sandbox_id))

    def init_pid(self, sandbox_id: str) -> int:
        found = self.loop.run_until_complete(self.backend.inspect(sandbox_id))
        assert found is not None and found.running
        return found.init_pid


@pytest.fixture(scope="module")
def node(
    image: str, image_names: dict[str, str], images_dir: Path, bundle: Path
) -> Iterator[InjectedNode]:
    home = Path(tempfile.mkdtemp(prefix="oe-inj-", dir="/tmp"))
    settings = LocalSettings(
        home=home,
        images_dir=images_dir,
        init_binary=ensure_init_binary(),
        executor_bundle=bundle,
    )
    loop = asyncio.new_event_loop()
    backend = LocalBackend(settings)
    made = InjectedNode(home, backend, loop, image_names[image])
    try:
        yield made
    finally:
        close_node(loop, backend, home)


def close_node(loop: asyncio.AbstractEventLoop, backend: LocalBackend, home: Path) -> None:
    """Delete every sandbox of ``backend``, close it and its loop, and clear ``home``."""
    try:
        for sandbox in loop.run_until_complete(backend.list()):
            loop.run_until_complete(backend.delete(sandbox.sandbox_id))
        loop.run_until_complete(backend.close())
    finally:
        loop.close()
        force_cleanup_home(home)


@pytest.fixture(scope="module")
def client(node: InjectedNode) -> Iterator[Client]:
    """A client of the executor inside the sandbox SANDBOX_ID (the executor tests' id)."""
    c = Client(node.create(SANDBOX_ID), node.home)
    try:
        # The executor suite's users (the busybox image has them already). This
        # writes the sandbox's own upper layer, never the image.
        added = c.run(SANDBOX_ID, shell=ADD_TEST_USERS)
        assert added.status.exit_code == 0, added.stderr
        yield c
    finally:
        c.close()


@pytest.fixture(scope="module")
def other_client(node: InjectedNode, client: Client) -> Iterator[Client]:
    c = Client(node.create(OTHER_SANDBOX_ID), node.home)
    try:
        yield c
    finally:
        c.close()
