"""Fixtures: one node home (short path under /tmp), orchard-init built once,
host sandboxes with a real orchard-init each, and one real executor process."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from orchard.executor.initbin import ensure_init_binary

from .harness import Client, ExecutorProcess, HostSandbox

SANDBOX_ID = "sb-exec-test"
OTHER_SANDBOX_ID = "sb-exec-other"


@pytest.fixture(scope="session")
def node_home() -> Iterator[Path]:
    home = Path(tempfile.mkdtemp(prefix="oe-", dir="/tmp"))
    try:
        yield home
    finally:
        shutil.rmtree(home, ignore_errors=True)


@pytest.fixture(scope="session")
def init_binary(node_home: Path) -> Path:
    return ensure_init_binary(node_home)


@pytest.fixture(scope="session")
def sandbox(node_home: Path, init_binary: Path) -> Iterator[HostSandbox]:
    box = HostSandbox(SANDBOX_ID, node_home, init_binary).create()
    try:
        yield box
    finally:
        box.stop()


@pytest.fixture(scope="session")
def other_sandbox(node_home: Path, init_binary: Path) -> Iterator[HostSandbox]:
    box = HostSandbox(OTHER_SANDBOX_ID, node_home, init_binary).create()
    try:
        yield box
    finally:
        box.stop()


@pytest.fixture(scope="session")
def executor(node_home: Path, sandbox: HostSandbox) -> Iterator[ExecutorProcess]:
    proc = ExecutorProcess.start(node_home)
    try:
        yield proc
    finally:
        proc.stop()


@pytest.fixture(scope="session")
def client(executor: ExecutorProcess, node_home: Path) -> Iterator[Client]:
    c = Client(executor.address, node_home)
    try:
        yield c
    finally:
        c.close()
