"""``OrchardEnvironment``: a Harbor environment backend whose container is an Orchard sandbox.

Harbor loads a custom backend by import path (``harbor run --env
orchard.integrations.harbor:OrchardEnvironment``, or ``environment.import_path`` in a
job config) and constructs it with the task's environment config plus the job's
environment kwargs (``--ek key=value``). This backend takes:

- ``endpoint`` / ``api_key``: where Orchard is (else ``ORCHARD_ENDPOINT`` /
  ``ORCHARD_API_KEY`` / the files ``orchard up`` writes, as for ``AsyncOrchard()``);
- ``images``: a mapping from the task's image reference to an Orchard image name,
  ``"*"`` for any other (see :mod:`orchard.integrations.harbor.images`);
- ``ttl``: seconds before Orchard deletes a sandbox that was never stopped.

One sandbox per environment (Harbor makes one per trial, and one more for a separate
verifier). Commands run through ``/bin/sh -c`` as Harbor's Docker backend runs them;
a command that times out raises ``TimeoutError`` (Harbor then reports its phase's
timeout); errors are mapped as :mod:`orchard.integrations.harbor.errors` says.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from harbor.environments.base import (
    BaseEnvironment,
    ExecResult,
    HealthcheckError,
    SandboxBuildFailedError,
)
from harbor.environments.capabilities import (
    EnvironmentCapabilities,
    EnvironmentResourceCapabilities,
)
from harbor.models.task.config import (
    EnvironmentConfig,
    NetworkAllowlistEntryType,
    NetworkMode,
    classify_network_allowlist_entry,
)
from harbor.models.task.config import NetworkPolicy as HarborNetworkPolicy
from harbor.models.trial.paths import TrialPaths

import orchard

from .errors import harbor_errors
from .images import ImageStandIn, UnsupportedEnvironmentError, orchard_image, stand_in

ENVIRONMENT_TYPE = "orchard"


class OrchardEnvironment(BaseEnvironment):
    """A Harbor environment backed by one Orchard sandbox."""

    def __init__(
        self,
        environment_dir: Path,
        environment_name: str,
        session_id: str,
        trial_paths: TrialPaths,
        task_env_config: EnvironmentConfig,
        *args: Any,
        endpoint: str | None = None,
        api_key: str | None = None,
        images: Mapping[str, str] | None = None,
        ttl: float | None = None,
        **kwargs: Any,
    ) -> None:
        # Set before the base __init__: it validates the definition and reads capabilities.
        self._endpoint = endpoint
        self._api_key = api_key
        if images is not None and not (
            isinstance(images, Mapping)
            and all(isinstance(k, str) and isinstance(v, str) for k, v in images.items())
        ):
            raise ValueError(f"images: expected a mapping of image names, got {images!r}")
        self._images = dict(images or {})
        self._ttl = ttl
        self._stand_in: ImageStandIn | None = None
        self._client: orchard.AsyncOrchard | None = None
        self._sandbox: orchard.AsyncSandbox | None = None
        super().__init__(
            environment_dir,
            environment_name,
            session_id,
            trial_paths,
            task_env_config,
            *args,
            **kwargs,
        )
        if self._host_mounts:
            raise ValueError(
                "Orchard sandboxes cannot bind host directories; remove the explicit mounts"
            )

    @staticmethod
    def type() -> str:
        return ENVIRONMENT_TYPE

    @property
    def capabilities(self) -> EnvironmentCapabilities:
        return EnvironmentCapabilities(
            disable_internet=True,
            network_allowlist=True,
            network_allowlist_hostnames=True,
            network_allowlist_wildcard_hostnames=True,
            network_allowlist_ipv4_addresses=True,
            network_allowlist_ipv4_cidrs=True,
            dynamic_network_policy=True,
        )

    @classmethod
    def resource_capabilities(cls) -> EnvironmentResourceCapabilities:
        # Orchard's cpu and memory are cgroup limits: hard ceilings.
        return EnvironmentResourceCapabilities(cpu_limit=True, memory_limit=True)

    def _validate_definition(self) -> None:
        try:
            self._stand_in = stand_in(self.environment_dir, self.task_env_config.docker_image)
        except UnsupportedEnvironmentError as exc:
            raise SandboxBuildFailedError(str(exc)) from None

    @property
    def sandbox(self) -> orchard.AsyncSandbox:
        """The running sandbox (after ``start``)."""
        if self._sandbox is None:
            raise RuntimeError("the Orchard environment is not started")
        return self._sandbox

    @property
    def _image(self) -> ImageStandIn:
        assert self._stand_in is not None  # set by _validate_definition in __init__
        return self._stand_in

    # ---- lifecycle ------------------------------------------------------------

    async def start(self, force_build: bool) -> None:
        if force_build and (self.environment_dir / "Dockerfile").exists():
            raise SandboxBuildFailedError(
                "Orchard does not build images: run without --force-build "
                "(the Dockerfile is read for FROM/WORKDIR/ENV/USER only)"
            )
        image = orchard_image(self._image.reference, self._images)
        memory = self._effective_memory_mb
        if self._effective_storage_mb:
            self.logger.warning(
                f"storage_mb={self._effective_storage_mb} is not applied per sandbox: "
                "Orchard caps every writable layer at the server's ORCHARD_SANDBOX_DISK_BYTES"
            )
        self._client = orchard.AsyncOrchard(self._endpoint, self._api_key)
        try:
            with harbor_errors("create"):
                self._sandbox = await self._client.sandboxes.create(
                    image=image,
                    cpu=self._effective_cpus,
                    memory=f"{memory}Mi" if memory else None,
                    network=orchard_network(self.network_policy),
                    ttl=self._ttl,
                    env={**self._image.env, **self._startup_env()},
                )
        except orchard.ImageNotFoundError as exc:
            await self._close_client()
            raise SandboxBuildFailedError(
                f"the task's image {self._image.reference!r} runs on Orchard image "
                f"{image!r}, which Orchard does not have ({exc}); map it with "
                "--ek 'images={\"" + self._image.reference + '": "debian:bookworm"}\''
            ) from exc
        except orchard.QuotaExceededError as exc:
            await self._close_client()
            raise HealthcheckError(f"Orchard refused a sandbox: {exc}") from exc
        except BaseException:
            await self._close_client()
            raise
        await self._make_workdir()
        await self.ensure_dirs(self._mount_targets(writable_only=True))
        await self._upload_environment_dir_after_start()

    async def _make_workdir(self) -> None:
        """Create the working directory a Dockerfile's WORKDIR (or task.toml) names, as
        ``docker build`` would; every command runs in it, so it must exist first."""
        workdir = self._workdir
        if not workdir:
            return
        with harbor_errors("create the working directory"):
            made = await self.sandbox.exec(["mkdir", "-p", "--", workdir], cwd="/", timeout=60)
        if made.exit_code != 0:
            raise SandboxBuildFailedError(f"WORKDIR {workdir}: {made.stderr_text.strip()}")

    async def stop(self, delete: bool) -> None:
        sandbox, self._sandbox = self._sandbox, None
        try:
            if sandbox is not None and delete:
                with contextlib.suppress(orchard.SandboxNotFoundError), harbor_errors("delete"):
                    await sandbox.delete()
            elif sandbox is not None:
                self.logger.info(f"Orchard sandbox {sandbox.id} kept (delete=False)")
        finally:
            await self._close_client()

    async def _close_client(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            await client.close()

    async def _apply_network_policy(self, network_policy: HarborNetworkPolicy) -> None:
        with harbor_errors("network policy"):
            await self.sandbox.set_network(orchard_network(network_policy))

    # ---- operations -----------------------------------------------------------

    @property
    def _workdir(self) -> str | None:
        return self.task_env_config.workdir or self._image.workdir

    async def exec(
        self,
        command: str,
        cwd: str | None = None,
        env: dict[str, str] | None = None,
        timeout_sec: int | None = None,
        user: str | int | None = None,
    ) -> ExecResult:
        resolved = self._resolve_user(user)
        if resolved is None:
            resolved = self._image.user
        with harbor_errors("exec"):
            result = await self.sandbox.exec(
                command,
                timeout=timeout_sec,
                cwd=cwd or self._workdir,
                env=self._merge_env(env),
                user=None if resolved is None else str(resolved),
            )
        if result.timed_out:
            raise TimeoutError(f"command timed out after {timeout_sec} seconds: {command[:200]}")
        status = result.status
        # A signal death is -1 in Orchard; the shell convention (Docker's too) is 128 + signal.
        code = 128 + status.signal if status.signal else result.exit_code
        return ExecResult(stdout=result.stdout_text, stderr=result.stderr_text, return_code=code)

    async def upload_file(self, source_path: Path | str, target_path: str) -> None:
        # an open file: the SDK streams it in chunks (read off the event loop)
        f = await asyncio.to_thread(open, source_path, "rb")
        try:
            with harbor_errors(f"upload {target_path}"):
                await self.sandbox.write_file(target_path, f)
        finally:
            await asyncio.to_thread(f.close)

    async def upload_dir(self, source_dir: Path | str, target_dir: str) -> None:
        with harbor_errors(f"upload {target_dir}"):
            await self.sandbox.upload(source_dir, target_dir)

    async def download_file(self, source_path: str, target_path: Path | str) -> None:
        await asyncio.to_thread(Path(target_path).parent.mkdir, parents=True, exist_ok=True)
        try:
            with harbor_errors(f"download {source_path}"):
                await self.sandbox.download_file(source_path, target_path)
        except BaseException:
            # download_file opened the local file first: leave no empty file behind
            with contextlib.suppress(FileNotFoundError):
                os.unlink(target_path)
            raise

    async def download_dir(self, source_dir: str, target_dir: Path | str) -> None:
        await asyncio.to_thread(Path(target_dir).mkdir, parents=True, exist_ok=True)
        with harbor_errors(f"download {source_dir}"):
            await self.sandbox.download(source_dir, target_dir)


def orchard_network(policy: HarborNetworkPolicy) -> str | orchard.NetworkPolicy:
    """Harbor's network policy as Orchard's (the base class has checked our capabilities)."""
    if policy.network_mode == NetworkMode.NO_NETWORK:
        return "none"
    if policy.network_mode == NetworkMode.PUBLIC:
        return "internet"
    cidrs: list[str] = []
    domains: list[str] = []
    for host in policy.allowed_hosts:
        kind = classify_network_allowlist_entry(host)
        if kind == NetworkAllowlistEntryType.IPV4_ADDRESS:
            cidrs.append(f"{host}/32")
        elif kind == NetworkAllowlistEntryType.IPV4_CIDR:
            cidrs.append(host)
        else:
            domains.append(host)
    return orchard.NetworkPolicy.allowlist(cidrs=cidrs, domains=domains)
