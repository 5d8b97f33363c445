"""Fixtures: a sandbox root in a temp directory, next to a host directory it must never reach.

``tmp_path/host`` stands for the host: it holds ``secret`` (and symlinks in the
sandbox point at it by absolute host path). ``tmp_path/rootfs`` is the
sandbox's root, with its own /etc/passwd so in-root resolution is visible.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
from collections.abc import AsyncIterator, Coroutine, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import grpc
import pytest
from orchard.executor.files import SandboxFiles

from orchard.common.errors import ServiceError

T = TypeVar("T")

HOST_SECRET = b"host secret: must never be read or overwritten\n"
SANDBOX_PASSWD = b"root:x:0:0:root:/root:/bin/sh\nagent:x:1000:1000::/home/agent:/bin/sh\n"


@dataclass
class Sandbox:
    root: Path
    host: Path
    files: SandboxFiles

    @property
    def secret(self) -> Path:
        return self.host / "secret"

    def host_snapshot(self) -> dict[str, bytes]:
        """Every file under the host dir with its content: compare before and after."""
        out: dict[str, bytes] = {}
        for dirpath, dirnames, filenames in os.walk(self.host):
            for name in filenames + dirnames:
                p = Path(dirpath, name)
                out[str(p.relative_to(self.host))] = (
                    p.read_bytes() if p.is_file() and not p.is_symlink() else b"<dir>"
                )
        return out


@pytest.fixture
def sandbox(tmp_path: Path) -> Sandbox:
    host = tmp_path / "host"
    host.mkdir()
    (host / "secret").write_bytes(HOST_SECRET)
    root = tmp_path / "rootfs"
    (root / "etc").mkdir(parents=True)
    (root / "etc" / "passwd").write_bytes(SANDBOX_PASSWD)
    (root / "home" / "agent").mkdir(parents=True)
    (root / "tmp").mkdir()
    return Sandbox(root=root, host=host, files=SandboxFiles(root))


def run(coro: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(coro)


async def collect(it: AsyncIterator[T]) -> list[T]:
    return [item async for item in it]


async def chunks(parts: Iterable[bytes]) -> AsyncIterator[bytes]:
    for part in parts:
        yield part


def refused(coro: Coroutine[Any, Any, object]) -> ServiceError:
    """Run ``coro`` and return the ServiceError it must raise."""
    with pytest.raises(ServiceError) as info:
        run(coro)
    return info.value


def assert_refused(
    coro: Coroutine[Any, Any, object], code: grpc.StatusCode, reason: str
) -> ServiceError:
    err = refused(coro)
    assert (err.code, err.reason) == (code, reason), err.message
    return err


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()
