"""``OrchardProvider``: a NeMo Gym sandbox provider whose sandboxes are Orchard's.

NeMo Gym's resources servers and agents run code through ``nemo_gym.sandbox``
(``AsyncSandbox(provider, spec)``), which talks to a provider object of the
``SandboxProvider`` protocol (``nemo_gym/sandbox/providers/base.py``). Installing this
package publishes the provider under the name ``orchard`` (entry point group
``nemo_gym.sandbox_providers``), so a config says ``{"orchard": {...}}``; ``register()``
does the same in-process with NeMo Gym's ``register_provider``.

Conventions followed are those of NeMo Gym's own Docker provider:

- ``exec`` never raises for a command that ran: a timeout is a result with
  ``return_code`` 125 and ``error_type="timeout"``; the platform failing under the
  command (``orchard.InfrastructureError``, the sandbox gone or not ready) is
  ``error_type="sandbox"``, which NeMo Gym's agents read as "sandbox unavailable";
- a create that fails raises ``OrchardCreateError`` (a ``SandboxCreateError``);
- ``upload_file`` / ``download_file`` raise ``FileNotFoundError`` for a missing path,
  ``PermissionError`` for a refused one, ``RuntimeError`` when the platform failed;
- ``status`` maps Orchard's state (pending -> STARTING, ready/claimed -> RUNNING,
  deleting/deleted or not found -> STOPPED, failed -> ERROR, unreachable -> UNKNOWN).

``endpoint(port)`` (NeMo Gym's optional ``SupportsSandboxEndpoint``) is the SDK's port
forwarding: a listener on this machine's loopback relaying to ``port`` inside the
sandbox, kept until the sandbox is closed. What a spec asks and Orchard cannot honour
(an ``entrypoint``, GPUs, a per-sandbox disk size, unknown ``provider_options``) is
refused with ``ValueError`` before anything is created.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nemo_gym.sandbox.providers.base import (
    SandboxCreateError,
    SandboxEndpoint,
    SandboxExecResult,
    SandboxHandle,
    SandboxSpec,
    SandboxStatus,
)

import orchard

from ._errors import UNAVAILABLE

PROVIDER_NAME = "orchard"
RUNTIME_RETURN_CODE = 125  # NeMo Gym's providers' "the runtime, not the command" code
PROVIDER_OPTIONS = frozenset({"network", "template", "pids"})


class OrchardCreateError(SandboxCreateError):
    """Orchard could not create (or make ready) the sandbox a spec asked for."""


@dataclass
class _Sandbox:
    """What the provider keeps in ``SandboxHandle.raw``."""

    sandbox: orchard.AsyncSandbox
    workdir: str | None
    forwards: dict[int, orchard.AsyncPortForward] = field(default_factory=dict)


class OrchardProvider:
    """NeMo Gym's ``SandboxProvider`` on Orchard (see the module docstring)."""

    name = PROVIDER_NAME

    def __init__(
        self,
        endpoint: str | None = None,
        api_key: str | None = None,
        data_plane: str | None = None,
        default_timeout_s: float = 180.0,
    ) -> None:
        """The provider config's keys (all optional: the client reads ``ORCHARD_*``).
        The client is made on first use, on the event loop that uses it (NeMo Gym's
        sync ``Sandbox`` runs the provider on a loop of its own)."""
        self._client_args = (endpoint, api_key, data_plane)
        self._client: orchard.AsyncOrchard | None = None
        self._default_timeout_s = default_timeout_s

    @property
    def client(self) -> orchard.AsyncOrchard:
        if self._client is None:
            endpoint, api_key, data_plane = self._client_args
            self._client = orchard.AsyncOrchard(endpoint, api_key, data_plane=data_plane)
        return self._client

    # ---- lifecycle ------------------------------------------------------------

    async def create(self, spec: SandboxSpec) -> SandboxHandle:
        kwargs = _create_kwargs(spec)
        try:
            sandbox = await self.client.sandboxes.create(
                request_id=uuid.uuid4().hex,
                timeout=spec.ready_timeout_s or 120.0,
                **kwargs,
            )
        except orchard.OrchardError as exc:
            raise OrchardCreateError(f"Orchard could not create the sandbox: {exc}") from exc
        raw = _Sandbox(sandbox, spec.workdir)
        if spec.workdir:
            # every exec runs in it (NeMo Gym passes spec.workdir as cwd): make it first
            try:
                made = await sandbox.exec(["mkdir", "-p", "--", spec.workdir], cwd="/", timeout=60)
                error = "" if made.exit_code == 0 else made.stderr_text.strip()
            except orchard.OrchardError as exc:
                error = str(exc)
            if error:
                await self._delete(raw)
                raise OrchardCreateError(f"workdir {spec.workdir}: {error}")
        return SandboxHandle(sandbox.id, PROVIDER_NAME, raw)

    async def status(self, handle: SandboxHandle) -> SandboxStatus:
        try:
            info = await _raw(handle).sandbox.info()
        except orchard.SandboxNotFoundError:
            return SandboxStatus.STOPPED
        except orchard.OrchardError:
            return SandboxStatus.UNKNOWN
        return _STATUS.get(info.state, SandboxStatus.UNKNOWN)

    async def close(self, handle: SandboxHandle) -> None:
        await self._delete(_raw(handle))

    async def _delete(self, raw: _Sandbox) -> None:
        forwards, raw.forwards = list(raw.forwards.values()), {}
        for forward in forwards:
            await forward.close()
        with contextlib.suppress(orchard.SandboxNotFoundError):
            await raw.sandbox.delete()

    async def aclose(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            await client.close()

    # ---- operations -----------------------------------------------------------

    async def exec(
        self,
        handle: SandboxHandle,
        command: str,
        *,
        cwd: str | None = None,
        env: dict[str, str] | None = None,
        timeout_s: int | float | None = None,
        user: str | int | None = None,
    ) -> SandboxExecResult:
        raw = _raw(handle)
        timeout = timeout_s if timeout_s is not None else self._default_timeout_s
        try:
            result = await raw.sandbox.exec(
                command,
                timeout=timeout,
                cwd=cwd or raw.workdir,
                env=env,
                user=_user(user),
            )
        except UNAVAILABLE as exc:
            return SandboxExecResult(None, str(exc), RUNTIME_RETURN_CODE, error_type="sandbox")
        except orchard.DeadlineExceededError as exc:
            return SandboxExecResult(None, str(exc), RUNTIME_RETURN_CODE, error_type="timeout")
        if result.timed_out:
            message = f"command timed out after {timeout:g}s"
            stderr = result.stderr_text + ("\n" if result.stderr else "") + message
            return SandboxExecResult(
                result.stdout_text, stderr, RUNTIME_RETURN_CODE, error_type="timeout"
            )
        status = result.status
        code = 128 + status.signal if status.signal else result.exit_code
        return SandboxExecResult(result.stdout_text, result.stderr_text, code)

    async def upload_file(self, handle: SandboxHandle, source_path: Path, target_path: str) -> None:
        if not await asyncio.to_thread(Path(source_path).is_file):
            raise FileNotFoundError(f"Source file not found: {source_path}")
        f = await asyncio.to_thread(open, source_path, "rb")  # the SDK streams it in chunks
        try:
            with _file_errors(f"upload to {target_path}"):
                await _raw(handle).sandbox.write_file(target_path, f)
        finally:
            await asyncio.to_thread(f.close)

    async def download_file(
        self, handle: SandboxHandle, source_path: str, target_path: Path
    ) -> None:
        await asyncio.to_thread(Path(target_path).parent.mkdir, parents=True, exist_ok=True)
        try:
            with _file_errors(f"download of {source_path}"):
                await _raw(handle).sandbox.download_file(source_path, target_path)
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(target_path)  # the SDK opened it first: leave no empty file
            raise

    async def endpoint(self, handle: SandboxHandle, port: int) -> SandboxEndpoint:
        """``http://127.0.0.1:N`` on this machine, relayed to ``port`` in the sandbox."""
        raw = _raw(handle)
        forward = raw.forwards.get(port)
        if forward is None:
            with _file_errors(f"forward of port {port}"):
                forward = await raw.sandbox.forward_port(port)
            raw.forwards[port] = forward
        return SandboxEndpoint(endpoint=forward.url)


def register(*, override: bool = False) -> None:
    """Register ``OrchardProvider`` as ``orchard`` with NeMo Gym (the entry point does
    this on install; call it where entry points are not read)."""
    from nemo_gym.sandbox.providers import register_provider

    register_provider(PROVIDER_NAME, OrchardProvider, override=override)


_STATUS = {
    "pending": SandboxStatus.STARTING,
    "ready": SandboxStatus.RUNNING,
    "claimed": SandboxStatus.RUNNING,
    "deleting": SandboxStatus.STOPPED,
    "deleted": SandboxStatus.STOPPED,
    "failed": SandboxStatus.ERROR,
}


def _raw(handle: SandboxHandle) -> _Sandbox:
    if handle.provider_name != PROVIDER_NAME or not isinstance(handle.raw, _Sandbox):
        raise ValueError(f"not an Orchard sandbox handle: {handle.provider_name!r}")
    return handle.raw


def _user(user: str | int | None) -> str | None:
    if user is None or user in ("root", 0, "0"):
        return None
    return str(user)


def _create_kwargs(spec: SandboxSpec) -> dict[str, Any]:
    """Orchard's create arguments for a spec; ``ValueError`` for what cannot be honoured."""
    if spec.entrypoint:
        raise ValueError(
            "Orchard sandboxes have no entrypoint: start the service with exec instead"
        )
    resources = spec.resources
    if resources.gpu or resources.gpu_type:
        raise ValueError("Orchard sandboxes have no GPUs")
    if resources.disk_gib:
        raise ValueError(
            "Orchard has no per-sandbox disk size (the server's ORCHARD_SANDBOX_DISK_BYTES "
            "caps every writable layer): leave resources.disk_gib unset"
        )
    unknown = set(spec.provider_options) - PROVIDER_OPTIONS
    if unknown:
        raise ValueError(
            f"unknown provider_options for orchard: {sorted(unknown)} "
            f"(known: {sorted(PROVIDER_OPTIONS)})"
        )
    options = spec.provider_options
    return {
        "image": spec.image,
        "cpu": resources.cpu,
        "memory": f"{resources.memory_mib}Mi" if resources.memory_mib else None,
        "ttl": spec.ttl_s,
        "env": spec.env or None,
        "labels": spec.metadata or None,
        "network": options.get("network"),
        "template": options.get("template"),
        "pids": options.get("pids"),
    }


@contextlib.contextmanager
def _file_errors(what: str) -> Iterator[None]:
    try:
        yield
    except orchard.PathNotFoundError as exc:
        raise FileNotFoundError(f"{what}: {exc}") from exc
    except orchard.PermissionDeniedError as exc:
        raise PermissionError(f"{what}: {exc}") from exc
    except UNAVAILABLE as exc:
        raise RuntimeError(f"Orchard sandbox unavailable during {what}: {exc}") from exc
