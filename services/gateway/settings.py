"""Settings of the gateway."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from orchard.common.tls import ServerTLS


@dataclass(frozen=True)
class GatewaySettings:
    home: Path
    """Where ``api_keys.json``, ``quotas.json`` and the embedded default's ``dev-api-key`` live."""
    scheduler: str
    """The scheduler's internal address."""
    listen: str = "127.0.0.1:50051"
    """The public gRPC endpoint; port 0 picks a free one."""
    http_listen: str | None = None
    """The REST/JSON front ("host:port", port 0 = free); None = no REST front."""
    metrics_listen: str | None = None
    """Prometheus ``/metrics`` ("host:port", port 0 = free); None = not served."""
    create_dev_key: bool = True
    """Make the ``dev`` tenant and its key file when there is no key file yet."""
    create_slots: int = 8
    """Creates forwarded to the scheduler at once; more wait in the fair per-tenant queue.
    Sized to what two cores do in parallel (runc, mounts, cgroups) with headroom."""
    data_plane_proxy: bool = True
    """Also serve ExecutorService, forwarding each call to the sandbox's node executor
    (``proxy.py``), for clients that cannot reach the executors (``ORCHARD_DATA_PLANE=proxy``)."""
    shutdown_grace_seconds: float = 5.0
    tls: ServerTLS | None = None
    """Serve TLS on the gRPC port and the REST front (``--tls-cert``/``--tls-key``/
    ``--tls-client-ca``, or ``$ORCHARD_TLS_CERT``/``$ORCHARD_TLS_KEY``/
    ``$ORCHARD_TLS_CLIENT_CA``); the address files then say ``grpcs://`` / ``https://``.
    None = plaintext (the loopback default)."""
    upstream_ca: Path | None = None
    """The CA that issued TLS executors' certificates, for the data-plane proxy and the REST
    front (``--tls-upstream-ca``, ``$ORCHARD_TLS_UPSTREAM_CA``); None = the system's roots.
    The gateway presents its own certificate to them (for executors that require mTLS)."""
    tenants_dir: Path | None = None
    """Read ``api_keys.json`` and ``quotas.json`` from here instead of ``home``
    (``--tenants-dir``): a mounted Kubernetes Secret, which the kubelet updates in place,
    so a key added or rotated there is used without a restart. None = ``home``."""
    health_listen: str | None = None
    """A plaintext port serving only ``grpc.health.v1`` (``--health-listen``), for the
    kubelet's gRPC probe, which cannot speak TLS; None = not served."""
