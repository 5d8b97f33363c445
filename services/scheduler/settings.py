"""Settings of the scheduler: small frozen dataclasses with defaults that work on one machine."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

GIB = 1 << 30
MIB = 1 << 20


@dataclass(frozen=True)
class CreateLimits:
    """Defaults and bounds for a create request; zero fields in a request mean "default"."""

    default_cpu_millis: int = 1000
    min_cpu_millis: int = 50
    # More than the machine has is allowed (cpu is a share, not a reservation)
    # but not absurd values that point at a client bug.
    max_cpu_millis: int = 64_000
    default_memory_bytes: int = GIB
    # Below this the image's shell itself can be OOM-killed; that looks like a
    # platform failure to a trainer, so it is refused up front.
    min_memory_bytes: int = 16 * MIB
    max_memory_bytes: int = 256 * GIB
    default_pids: int = 512
    min_pids: int = 8
    max_pids: int = 65_536
    default_ttl_seconds: int = 3600
    max_ttl_seconds: int = 7 * 24 * 3600
    max_labels: int = 64
    max_label_value_chars: int = 256
    max_env: int = 256
    max_env_value_bytes: int = 32 * 1024
    # All of env together: it is copied into every command the sandbox runs.
    max_env_total_bytes: int = 256 * 1024
    max_request_id_chars: int = 128


@dataclass(frozen=True)
class PoolSettings:
    """How warm pools are kept (see ``pools.WarmPool`` for the target formula)."""

    tick_seconds: float = 0.5
    """How often the filler re-checks every pool (claims and hints also wake it at once)."""
    parallel_creates: int = 4
    """Member creates in flight at once, over all pools: leaves backend slots for cold creates."""
    scale_down_delay_seconds: float = 30.0
    """A pool holds more than its target this long before the surplus is removed."""
    rate_window_seconds: float = 30.0
    """Time constant of the claim-rate EWMA."""
    headroom: float = 2.0
    """Ready members per claim expected during one refill."""
    hint_hold_seconds: float = 60.0
    """A hint stays live this long past its arrival time unless claims use it up first."""
    refill_quiet_seconds: float = 0.25
    """Refills wait until claims pause this long, so member creates (runc, CPU-heavy) do not
    slow a burst of claims down; a pool below ``refill_low_water`` of its target refills at once."""
    refill_low_water: float = 0.5
    """Fraction of the target under which a pool refills even while claims keep coming."""
    max_failure_backoff_seconds: float = 60.0
    """After failed member creates a pool waits, doubling up to this, before trying again."""


@dataclass(frozen=True)
class SchedulerSettings:
    home: Path
    """Node home (layout.NodeLayout): state.db and secrets/token.key live here."""
    listen: str = "127.0.0.1:0"
    """Where the internal SandboxService listens; port 0 picks a free one."""
    executor_address: str = ""
    """The node executor's address, handed to clients for the data plane of sandboxes
    that do not run their own executor ("" = there is no node executor: Kubernetes)."""
    executor_tls: bool = False
    """The node executor at ``executor_address`` serves TLS: clients are told so
    (``ExecutorAccess.tls``) and dial it as ``grpcs://``. Sandboxes with their own
    executor (an address the backend reported) are not covered by it."""
    executor_bundle: Path | None = None
    """Local backend: the executor bundle; sandboxes of runtime class "" then run
    injected (their own executor, at ``unix:<home>/sandboxes/<id>/run/executor.sock``)."""
    backend: str = "local"
    """Backend name for ``backends.registry.load_backend`` ("local" or "kubernetes")."""
    images_dir: Path | None = None
    """Images folder for the backend; None means ``<home>/images``."""
    init_binary: Path | None = None
    """The sandbox init (orchard-init) the local backend runs as each sandbox's pid 1."""
    token_ttl_seconds: float = 3600.0
    """Data-plane token lifetime; capped by the sandbox's expiry."""
    reap_interval_seconds: float = 2.0
    """How often the TTL reaper looks for expired sandboxes."""
    revocation_check_seconds: float = 0.5
    """How often ``revocations.json`` is looked at for sandboxes with their own executor
    (``revocations.py``: local injected and runsc sandboxes are sent notices)."""
    revocation_give_up_seconds: float = 30.0
    """A sandbox whose own executor has not taken a revocation notice for this long is
    deleted (``$ORCHARD_REVOCATION_GIVE_UP_SECONDS``)."""
    delete_all_on_shutdown: bool = False
    """Delete every sandbox on graceful shutdown (``orchard up`` leaves nothing behind)."""
    delete_waits_for_teardown: bool = False
    """A client's delete answers only after the container, mounts and cgroups are gone.
    False (default): it answers once the record is DELETING and tears down in the
    background (the tenant's quota is free from then on; ``lifecycle.delete``)."""
    shutdown_grace_seconds: float = 5.0
    """How long in-flight calls get to finish on shutdown."""
    metrics_listen: str | None = None
    """Serve Prometheus ``/metrics`` here ("host:port", port 0 = free); None = not served."""
    health_listen: str | None = None
    """A plaintext port serving only ``grpc.health.v1`` (``--health-listen``), for the
    kubelet's gRPC probe: the scheduler's own port speaks only mutual TLS with internal
    certificates. None = not served."""
    limits: CreateLimits = field(default_factory=CreateLimits)
    pools: PoolSettings = field(default_factory=PoolSettings)
