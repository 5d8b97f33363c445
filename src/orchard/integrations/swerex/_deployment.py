"""``OrchardDeployment``: SWE-ReX's ``AbstractDeployment`` as one Orchard sandbox.

``start()`` creates (or claims from a warm pool, or attaches to) a sandbox and
makes an :class:`OrchardRuntime` on it; ``stop()`` closes the runtime's
sessions and deletes the sandbox (not one given by ``sandbox_id``). Nothing
is started inside the sandbox: the runtime speaks the Orchard SDK, not
SWE-ReX's HTTP server, so any image works.
"""

from __future__ import annotations

import contextlib
import logging
from typing import Any

from swerex.deployment.abstract import AbstractDeployment
from swerex.deployment.hooks.abstract import CombinedDeploymentHook, DeploymentHook
from swerex.exceptions import DeploymentNotStartedError, DeploymentStartupError
from swerex.runtime.abstract import IsAliveResponse

import orchard

from .._sandbox_fields import SandboxFields
from ._runtime import OrchardRuntime


class OrchardDeploymentConfig(SandboxFields):
    """The sandbox a deployment runs in (unknown fields are refused)."""

    startup_timeout: float = 120.0
    """Seconds the create may take (a cold create is well under one)."""


class OrchardDeployment(AbstractDeployment):
    def __init__(
        self,
        *,
        logger: logging.Logger | None = None,
        client: orchard.AsyncOrchard | None = None,
        **kwargs: Any,
    ) -> None:
        self.logger = logger or logging.getLogger("rex-deploy")
        self._config = OrchardDeploymentConfig(**kwargs)
        self._client = client
        self._owns_client = client is None
        self._hooks = CombinedDeploymentHook()
        self._runtime: OrchardRuntime | None = None

    @classmethod
    def from_config(cls, config: OrchardDeploymentConfig) -> OrchardDeployment:
        return cls(**config.model_dump())

    def add_hook(self, hook: DeploymentHook) -> None:
        self._hooks.add_hook(hook)

    async def is_alive(self, *, timeout: float | None = None) -> IsAliveResponse:  # noqa: ASYNC109 (SWE-ReX's signature)
        if self._runtime is None:
            return IsAliveResponse(is_alive=False, message="Runtime is None.")
        return await self._runtime.is_alive(timeout=timeout)

    async def start(self) -> None:
        cfg = self._config
        if self._client is None:
            self._client = orchard.AsyncOrchard()
        try:
            if cfg.sandbox_id is not None:
                self._hooks.on_custom_step(f"Attaching to Orchard sandbox {cfg.sandbox_id}")
                sandbox = await self._client.sandboxes.connect(cfg.sandbox_id)
            else:
                self._hooks.on_custom_step("Starting Orchard sandbox")
                sandbox = await self._client.sandboxes.create(
                    **cfg.create_arguments("swe-rex/deployment"), timeout=cfg.startup_timeout
                )
        except orchard.OrchardError as err:
            raise DeploymentStartupError(f"could not start the Orchard sandbox: {err}") from err
        self.logger.info("Orchard sandbox %s is ready", sandbox.id)
        self._runtime = OrchardRuntime(sandbox, logger=self.logger)

    async def stop(self) -> None:
        runtime, self._runtime = self._runtime, None
        if runtime is not None:
            await runtime.close()
            if self._config.sandbox_id is None:
                with contextlib.suppress(orchard.SandboxNotFoundError):  # already reaped
                    await runtime.sandbox.delete()
        if self._owns_client and self._client is not None:
            client, self._client = self._client, None
            await client.close()

    @property
    def runtime(self) -> OrchardRuntime:
        if self._runtime is None:
            raise DeploymentNotStartedError()  # type: ignore[no-untyped-call]
        return self._runtime
