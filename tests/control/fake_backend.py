"""A STAND-IN backend for control-plane tests that need no containers.

It keeps sandboxes in a dict and makes no container. Tests of validation,
auth, tenancy, idempotency, recovery rules and the reaper use it so they run
anywhere fast; the ``runc``-marked tests in this folder use the real ``local``
backend for everything that must touch a real sandbox.
"""

from __future__ import annotations

import asyncio
import builtins
from typing import Any

from orchard.scheduler.backends.base import (
    BackendError,
    BackendSandbox,
    Capability,
    ImageInfo,
    SandboxSpec,
)


class FakeBackend:
    """The required operations only; subclasses add a capability by declaring it."""

    name = "fake"
    capabilities: frozenset[Capability[Any]] = frozenset()

    def __init__(self, images: tuple[str, ...] = ("debian",), create_delay: float = 0.0) -> None:
        self.sandboxes: dict[str, SandboxSpec] = {}
        self.image_names = images
        self.create_delay = create_delay
        self.creates = 0
        self.deletes: list[str] = []
        self.fail_next_create: str | None = None

    async def create(self, spec: SandboxSpec) -> BackendSandbox:
        self.creates += 1
        await asyncio.sleep(self.create_delay)
        if self.fail_next_create is not None:
            message, self.fail_next_create = self.fail_next_create, None
            raise BackendError.failure(message)
        if spec.image and spec.image not in self.image_names:
            raise BackendError.invalid(f"image {spec.image!r} not found", reason="IMAGE_NOT_FOUND")
        self.sandboxes[spec.sandbox_id] = spec
        return BackendSandbox(spec.sandbox_id, running=True, init_pid=1)

    async def delete(self, sandbox_id: str) -> None:
        self.deletes.append(sandbox_id)
        self.sandboxes.pop(sandbox_id, None)

    async def list(self) -> builtins.list[BackendSandbox]:
        return [BackendSandbox(i, running=True, init_pid=1) for i in self.sandboxes]

    async def inspect(self, sandbox_id: str) -> BackendSandbox | None:
        return BackendSandbox(sandbox_id, True, 1) if sandbox_id in self.sandboxes else None

    async def images(self) -> builtins.list[ImageInfo]:
        return [ImageInfo(n, 1000, 1, i == 0) for i, n in enumerate(self.image_names)]
