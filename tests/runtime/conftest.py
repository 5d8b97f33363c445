"""Fixtures for the local runtime tests: the shared image store, orchard-init, a temp home.

Every test gets its own ORCHARD home (short, under /tmp, so socket paths stay
short) but shares the image store (``$ORCHARD_IMAGES_DIR``, default
/var/lib/orchard/images) where the default Debian image is built once if
missing. Whatever a test leaves behind (containers, mounts, cgroups) is removed
by the ``backend`` fixture's finalizer, even when the test fails.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import tempfile
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import TypeVar

import pytest
from orchard.scheduler.backends.local.backend import LocalBackend
from orchard.scheduler.backends.local.images import build_default_image
from orchard.scheduler.backends.local.settings import LocalSettings

from .runtime_helpers import force_cleanup_home

HERE = Path(__file__).parent
T = TypeVar("T")


def _can_run_containers() -> str | None:
    if os.geteuid() != 0:
        return "needs root"
    if shutil.which("runc") is None:
        return "needs runc"
    if (
        shutil.which("mmdebstrap") is None
        and not _images_dir().joinpath("debian+bookworm", "image.json").is_file()
    ):
        return "needs mmdebstrap or a built default image"
    return None


def _images_dir() -> Path:
    return Path(os.environ.get("ORCHARD_IMAGES_DIR") or "/var/lib/orchard/images")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    reason = _can_run_containers()
    if reason is None:
        return
    for item in items:
        if "runc" in item.keywords:
            item.add_marker(pytest.mark.skip(reason=reason))


@pytest.fixture(scope="session")
def images_dir() -> Path:
    """The shared image store, with the default image built once (expensive) if missing."""
    path = _images_dir()
    build_default_image(path)
    return path


@pytest.fixture(scope="session")
def init_binary(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The real orchard-init if the executor package has it, else the tests' stand-in."""
    try:
        from orchard.executor.initbin import ensure_init_binary
    except ImportError:
        out = tmp_path_factory.mktemp("init") / "standin-init"
        subprocess.run(
            ["gcc", "-static", "-O2", "-o", str(out), str(HERE / "standin_init.c")], check=True
        )
        return out
    return ensure_init_binary()


@pytest.fixture
def home() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="orch-", dir="/tmp"))
    try:
        yield path
    finally:
        force_cleanup_home(path)


@pytest.fixture
def settings(home: Path, images_dir: Path, init_binary: Path) -> LocalSettings:
    return LocalSettings(home=home, images_dir=images_dir, init_binary=init_binary)


@pytest.fixture
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    """One event loop per test: the backend's locks and semaphore live on it."""
    new_loop = asyncio.new_event_loop()
    try:
        yield new_loop
    finally:
        new_loop.close()


@pytest.fixture
def run(loop: asyncio.AbstractEventLoop) -> Callable[[Awaitable[T]], T]:
    """``run(backend.create(...))``: tests stay synchronous and probe the host between calls."""

    def run_on_loop(awaitable: Awaitable[T]) -> T:
        return loop.run_until_complete(awaitable)

    return run_on_loop


@pytest.fixture
def backend(settings: LocalSettings, loop: asyncio.AbstractEventLoop) -> Iterator[LocalBackend]:
    """A backend on the test's home; every sandbox left at the end is deleted."""
    made = LocalBackend(settings)
    try:
        yield made
    finally:
        try:
            loop.run_until_complete(made.close())
        finally:
            asyncio.run(_delete_everything(settings))


async def _delete_everything(settings: LocalSettings) -> None:
    cleaner = LocalBackend(settings)
    try:
        for sandbox in await cleaner.list():
            await cleaner.delete(sandbox.sandbox_id)
    finally:
        await cleaner.close()
