"""The backend interface: the scheduler's only way to make and remove sandboxes.

A backend owns sandbox *lifecycle* on a node (create, delete, list, inspect,
images) and nothing else: exec and files go through the node executor and the
sandbox's init socket, never through the backend. Backends are chosen by name
(``local`` now, ``kubernetes`` later) with :func:`load_backend`, so nothing
above the scheduler knows which one runs.
"""

from __future__ import annotations

import builtins
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol, runtime_checkable

from orchard.common.layout import SANDBOX_ID_RE

from .netpolicy.policy import NetworkPolicySpec

# The only network mode the backends implement so far: a network namespace with
# nothing but an UP loopback interface.
NETWORK_NONE = "none"

# BackendError.reason of a claim the backend refused because another scheduler
# replica claimed the same warm-pool member first (it is theirs, not broken).
CLAIMED_ELSEWHERE = "CLAIMED_ELSEWHERE"


@dataclass(frozen=True)
class SandboxSpec:
    """What the scheduler asks a backend to create (already validated by the scheduler)."""

    sandbox_id: str
    """Scheduler-generated id; checked with ``layout.is_valid_sandbox_id``."""
    image: str = ""
    """Image name in the node's image store; "" means the backend's default image."""
    cpu_millis: int = 1000
    """CPU limit, 1000 = one core."""
    memory_bytes: int = 1 << 30
    """Hard memory limit (no swap on top)."""
    pids: int = 512
    """Maximum number of processes and threads in the sandbox."""
    network_mode: str = NETWORK_NONE
    """The mode of ``network`` ("none", "allowlist", "internet"), for backends that need only it."""
    network: NetworkPolicySpec = field(default_factory=NetworkPolicySpec)
    """The whole network policy (``netpolicy.policy``), already validated."""
    env: dict[str, str] = field(default_factory=dict)
    """Create-time environment, merged over the image's environment."""
    tenant: str = ""
    """Whose sandbox it is ("" = an unclaimed pool member). The local backend shares the
    CPU fairly between tenants first (``local.oci_config.tenant_group``), so one tenant's busy
    sandboxes cannot starve another tenant's."""
    runtime_class: str = ""
    """How the sandbox runs: "" = the backend's default; locally "runc" (served by the
    node executor) or "injected" (its own executor from the bundle); on Kubernetes a
    RuntimeClass name (gVisor, Kata)."""


@dataclass(frozen=True)
class BackendSandbox:
    """A sandbox as the backend sees it on the node."""

    sandbox_id: str
    running: bool
    init_pid: int
    """Host pid of the sandbox's init, 0 when it is not running."""
    executor_address: str = ""
    """Where clients reach this sandbox's own executor (injected mode: a unix socket;
    Kubernetes: pod IP:port); "" = the node executor
    (``SchedulerSettings.executor_address``) serves it."""


@dataclass(frozen=True)
class ImageInfo:
    name: str
    size_bytes: int
    layers: int
    is_default: bool


class BackendError(Exception):
    """A backend operation failed.

    ``reason`` is an ``ErrorReason``-style name ("IMAGE_NOT_FOUND",
    "INVALID_ARGUMENT", "UNSUPPORTED", "BACKEND_FAILURE", ...) and
    ``client_fault`` tells a bad request (the caller can fix it) apart from an
    infrastructure failure (retry elsewhere, drop the rollout).
    """

    def __init__(self, reason: str, message: str, *, client_fault: bool = False) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message
        self.client_fault = client_fault

    @classmethod
    def failure(cls, message: str) -> BackendError:
        return cls("BACKEND_FAILURE", message, client_fault=False)

    @classmethod
    def invalid(cls, message: str, reason: str = "INVALID_ARGUMENT") -> BackendError:
        return cls(reason, message, client_fault=True)


@runtime_checkable
class Backend(Protocol):
    """Sandbox lifecycle on one node (or one cluster)."""

    name: str

    async def create(self, spec: SandboxSpec) -> BackendSandbox:
        """Create and start a sandbox; returns when its init accepts on its socket."""
        ...

    async def delete(self, sandbox_id: str) -> None:
        """Remove a sandbox and everything it left on the node; idempotent."""
        ...

    async def list(self) -> builtins.list[BackendSandbox]:
        """Every sandbox that exists on the node (for recovery after a crash)."""
        ...

    async def inspect(self, sandbox_id: str) -> BackendSandbox | None:
        """One sandbox, or None when nothing of it exists."""
        ...

    async def images(self) -> builtins.list[ImageInfo]:
        """The images sandboxes can be created from."""
        ...


def valid_sandbox_id(sandbox_id: str) -> bool:
    """``layout.SANDBOX_ID_RE`` over the whole string.

    (``re.match`` with ``$`` also accepts a trailing newline, which must never
    reach a path or a runc argument.)
    """
    return SANDBOX_ID_RE.fullmatch(sandbox_id) is not None


def check_sandbox_id(sandbox_id: str) -> None:
    if not valid_sandbox_id(sandbox_id):
        raise BackendError.invalid(f"invalid sandbox id {sandbox_id!r}")


def load_backend(name: str, settings: object = None) -> Backend:
    """The backend called ``name``, configured from ``settings``.

    ``settings`` may be the backend's own settings object (e.g.
    ``LocalSettings``) or any object with a ``home`` attribute (and optionally
    ``images_dir``), such as the scheduler's settings.
    """
    if name == "local":
        from .local.backend import LocalBackend
        from .local.settings import LocalSettings

        if isinstance(settings, LocalSettings):
            return LocalBackend(settings)
        if settings is None:
            return LocalBackend(LocalSettings.from_env())
        home = getattr(settings, "home", None)
        if home is None:
            raise BackendError.invalid("local backend settings need a home folder")
        images_dir = getattr(settings, "images_dir", None)
        init_binary = getattr(settings, "init_binary", None)
        bundle = getattr(settings, "executor_bundle", None)
        return LocalBackend(
            LocalSettings(
                home=Path(home),
                images_dir=Path(images_dir) if images_dir is not None else None,
                init_binary=Path(init_binary) if init_binary is not None else None,
                executor_bundle=Path(bundle) if bundle is not None else None,
            )
        )
    if name == "kubernetes":
        from .kubernetes import KubernetesBackend, KubernetesSettings
        from .kubernetes.pod_settings import PodSettingsError

        if isinstance(settings, KubernetesSettings):
            return KubernetesBackend(settings)
        home = getattr(settings, "home", None)
        try:
            k8s = KubernetesSettings.from_env(Path(home) if home is not None else None)
        except PodSettingsError as err:
            raise BackendError.invalid(f"kubernetes backend: {err}") from err
        return KubernetesBackend(k8s)
    raise BackendError.invalid(f"unknown backend {name!r}", reason="UNSUPPORTED")
