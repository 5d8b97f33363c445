"""The backend contract: everything a backend must and may implement, in this one module.

A backend owns sandbox *lifecycle* on a node (create, delete, list, inspect,
images) and nothing else: exec and files go through the node executor and the
sandbox's init socket, never through the backend. Backends are chosen by name
in ``registry`` (``local``, ``kubernetes``), so nothing above the scheduler
knows which one runs; each is built from its own settings dataclass.

Required: :class:`Backend` (``name``, ``capabilities``, the five operations).
Optional: one Protocol per capability below, and a backend says which it has
by listing them in ``capabilities``::

    POOL_STATE          create_pool_member, create_owned, claim_member (Kubernetes)
    UPDATE_ENV          update_env: a warm member takes the claimer's env (local)
    UPDATE_NETWORK      update_network: a running sandbox's policy changes (both)
    REPORT_FAILURES     failure: sandboxes that died behind the scheduler's back (both)
    CHECK_RUNTIME_CLASS check_runtime_class: refuse a template's class at start (local)
    MODEL_ENDPOINT      check_model_endpoint: sandboxes can have a model endpoint (local)
    CLOSE               close: the backend's own shutdown (both)
    PUSHES_REVOCATIONS  (no method) it tells its sandboxes' executors of revocations
                        itself (Kubernetes: ``revocation_push``); otherwise the
                        scheduler does, for every sandbox with its own executor

Why a declaration and not ``isinstance`` on runtime-checkable Protocols (what
the scheduler did before): ``isinstance`` against a Protocol only checks that
attribute *names* exist, so any backend that happened to have a ``failure`` or
``close`` attribute was silently treated as implementing the capability, and
the probes were spread over the lifecycle, the service and the server. Here a
backend's capabilities are one line anyone can read, callers ask
:func:`supports` (which returns the backend typed as the capability's
Protocol, or None), and :func:`check_capabilities` refuses at start a
declaration that names a method the backend lacks. The Protocols stay the
typed description of each method, as mini-swe-agent keeps its in one short
file.

The module keeps its historic name ``base`` so the many ``from ..base import
BackendError`` of both backends did not move.
"""

from __future__ import annotations

import builtins
from dataclasses import dataclass, field
from typing import Any, Generic, Protocol, TypeVar, cast

from orchard.common.layout import SANDBOX_ID_RE

from .netpolicy.policy import NetworkPolicySpec

# The only network mode the backends implement so far: a network namespace with
# nothing but an UP loopback interface.
NETWORK_NONE = "none"

# The model endpoint inside a sandbox (``local.model_endpoint``): where commands reach the
# node's recording model proxy, whatever the network policy; the same on every node.
MODEL_ENDPOINT_HOST = "127.0.0.1"
MODEL_ENDPOINT_PORT = 7711
MODEL_ENDPOINT_BASE = f"http://{MODEL_ENDPOINT_HOST}:{MODEL_ENDPOINT_PORT}"
MODEL_ENDPOINT_ENV = "ORCHARD_MODEL_BASE"
"""The variable commands of such a sandbox get, set to ``MODEL_ENDPOINT_BASE``."""

# BackendError.reason of a claim the backend refused because another scheduler
# replica claimed the same warm-pool member first (it is theirs, not broken).
CLAIMED_ELSEWHERE = "CLAIMED_ELSEWHERE"

# BackendError.reason of a create that asked for a tools layer the node has not built.
TOOLS_LAYER_NOT_BUILT = "TOOLS_LAYER_NOT_BUILT"


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
    model_endpoint: bool = False
    """Give the sandbox a model endpoint (``MODEL_ENDPOINT_BASE`` inside, relayed to the
    node's model proxy); only asked of a backend with the MODEL_ENDPOINT capability."""
    tool_layers: tuple[str, ...] = ()
    """Tools layers to mount read-only (``orchard.scheduler.tools``), names already
    checked; a backend that cannot mount one raises BackendError TOOLS_LAYER_NOT_BUILT
    (not built on the node) or UNSUPPORTED."""


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


class Backend(Protocol):
    """Sandbox lifecycle on one node (or one cluster): what every backend implements."""

    name: str
    """The name the registry knows it by (logs and error messages say it)."""
    capabilities: frozenset[Capability[Any]]
    """The optional capabilities below that this backend implements."""

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


# ---- optional capabilities ----------------------------------------------------------

P = TypeVar("P")


@dataclass(frozen=True)
class Capability(Generic[P]):
    """An optional part of the contract; ``P`` is the Protocol a backend that declares it
    satisfies, ``methods`` what :func:`check_capabilities` looks for."""

    name: str
    methods: tuple[str, ...]


class PoolState(Protocol):
    """A backend that keeps pool state itself (Kubernetes: the pods' labels and deadlines).

    Members are made with ``create_pool_member`` (free, with a long deadline),
    sandboxes owned from the start with ``create_owned`` (owner and TTL on the
    object, so the backstop holds without the scheduler), and a claim the store
    granted is confirmed on the object with ``claim_member`` (optimistic
    concurrency there: a conflict is a failed claim, never a shared sandbox).
    """

    async def create_pool_member(self, spec: SandboxSpec, template: str) -> BackendSandbox: ...

    async def create_owned(
        self, spec: SandboxSpec, *, tenant: str, ttl_seconds: int, template: str
    ) -> BackendSandbox: ...

    async def claim_member(
        self, sandbox_id: str, *, tenant: str, ttl_seconds: int, labels: dict[str, str]
    ) -> None: ...


class EnvUpdating(Protocol):
    """A backend that can change a running sandbox's command environment.

    Claims need it to apply the claimer's env to a warm member (the local
    backend rewrites the sandbox.json the executor reads). Without it, a claim
    that brings env is served cold.
    """

    async def update_env(self, sandbox_id: str, env: dict[str, str]) -> None: ...


class NetworkUpdating(Protocol):
    """A backend that can change a running sandbox's network policy."""

    async def update_network(self, sandbox_id: str, policy: NetworkPolicySpec) -> None: ...


class SandboxFailure(Protocol):
    """Why a running sandbox failed, as a backend reports it (``BackendError`` is one)."""

    @property
    def reason(self) -> str: ...
    @property
    def message(self) -> str: ...
    @property
    def client_fault(self) -> bool: ...


class FailureReporting(Protocol):
    """A backend whose sandboxes can fail behind the scheduler's back (init died, eviction)."""

    async def failure(self, sandbox_id: str) -> SandboxFailure | None: ...


class RuntimeClassChecking(Protocol):
    """A backend that knows every runtime class it runs, so a template naming another
    stops the scheduler's start (Kubernetes takes any RuntimeClass the cluster has)."""

    def check_runtime_class(self, runtime_class: str) -> None:
        """Raise ``BackendError`` (client fault) for a class this backend cannot run."""
        ...


class ModelEndpointing(Protocol):
    """A backend that can give a sandbox a model endpoint (``SandboxSpec.model_endpoint``)."""

    def check_model_endpoint(self, runtime_class: str) -> None:
        """Raise ``BackendError`` (client fault, UNSUPPORTED) when sandboxes of this class
        cannot have one, before anything is created."""
        ...


class Closing(Protocol):
    """A backend with its own shutdown (the scheduler calls it once, on stop)."""

    async def close(self) -> None: ...


POOL_STATE: Capability[PoolState] = Capability(
    "pool_state", ("create_pool_member", "create_owned", "claim_member")
)
UPDATE_ENV: Capability[EnvUpdating] = Capability("update_env", ("update_env",))
UPDATE_NETWORK: Capability[NetworkUpdating] = Capability("update_network", ("update_network",))
REPORT_FAILURES: Capability[FailureReporting] = Capability("report_failures", ("failure",))
CHECK_RUNTIME_CLASS: Capability[RuntimeClassChecking] = Capability(
    "check_runtime_class", ("check_runtime_class",)
)
MODEL_ENDPOINT: Capability[ModelEndpointing] = Capability(
    "model_endpoint", ("check_model_endpoint",)
)
CLOSE: Capability[Closing] = Capability("close", ("close",))
PUSHES_REVOCATIONS: Capability[object] = Capability("pushes_revocations", ())


def supports(backend: Backend, capability: Capability[P]) -> P | None:
    """``backend`` typed as ``capability``'s Protocol when it declares it, else None."""
    if capability in backend.capabilities:
        return cast(P, backend)
    return None


def check_capabilities(backend: Backend) -> None:
    """Refuse (TypeError: a programming error, at start) a backend whose declaration names
    a capability without its methods."""
    for capability in backend.capabilities:
        missing = [m for m in capability.methods if not callable(getattr(backend, m, None))]
        if missing:
            raise TypeError(
                f"the {backend.name} backend declares {capability.name} but has no "
                f"{', '.join(missing)}"
            )
