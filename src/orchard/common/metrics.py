"""Prometheus metrics every service shares, and the HTTP port they are scraped on.

Each service process serves ``GET /metrics`` on its own port
(``--metrics-listen``; ``orchard up`` picks free ports and writes them to
``<home>/run/<service>.metrics.addr``), only to a scraper that sends
``Authorization: Bearer <token>`` with the token of ``<home>/secrets/metrics-token``
(0600, made by the first service that needs it; ``$ORCHARD_METRICS_TOKEN_FILE``
elsewhere, e.g. the chart's Secret), see :func:`serve_metrics`. The names, all prefixed ``orchard_``:

=================================  =========  =====================================
``rpc_requests_total``             counter    calls by service, method, status code
``rpc_seconds``                    histogram  call latency by service, method
``quota_rejections_total``         counter    RESOURCE_EXHAUSTED by tenant and quota
``phase_seconds``                  histogram  latency of one phase of a sandbox's life:
                                              ``queue`` (wait in the gateway's fair
                                              admission), ``create`` (backend create),
                                              ``ready`` (create request to READY in the
                                              scheduler), ``claim`` (warm-pool claim),
                                              ``first_exec`` (a sandbox's first command),
                                              ``exec`` (every command)
``sandboxes``                      gauge      live sandboxes by tenant and state (the
                                              scheduler counts its store at scrape time)
=================================  =========  =====================================

Children (label combinations) used on hot paths are cached by the callers, so
an observation is one lock and an add.
"""

from __future__ import annotations

import hmac
import os
import secrets
import threading
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, make_server

from prometheus_client import REGISTRY, Counter, Histogram, make_wsgi_app
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.exposition import ThreadingWSGIServer
from prometheus_client.registry import Collector

from .address_file import write_address_file

# Buckets from 0.1 ms (an exec of `true` is ~1 ms) to 60 s (a cold image pull).
LATENCY_BUCKETS = (
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
    0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
)  # fmt: skip

RPC_REQUESTS = Counter(
    "orchard_rpc_requests_total", "gRPC calls served", ["service", "method", "code"]
)
RPC_SECONDS = Histogram(
    "orchard_rpc_seconds",
    "gRPC call latency (server side)",
    ["service", "method"],
    buckets=LATENCY_BUCKETS,
)
QUOTA_REJECTIONS = Counter(
    "orchard_quota_rejections_total",
    "Calls refused with RESOURCE_EXHAUSTED because a tenant was over a quota",
    ["service", "tenant", "quota"],
)
PHASE_SECONDS = Histogram(
    "orchard_phase_seconds",
    "Latency of one phase of a sandbox's life (queue, create, ready, claim, first_exec, exec)",
    ["phase"],
    buckets=LATENCY_BUCKETS,
)
PHASES = ("queue", "create", "ready", "claim", "first_exec", "exec")


def observe_phase(phase: str, seconds: float) -> None:
    PHASE_SECONDS.labels(phase).observe(seconds)


def count_quota_rejection(service: str, tenant: str, quota: str) -> None:
    QUOTA_REJECTIONS.labels(service, tenant, quota).inc()


class SandboxCountCollector(Collector):
    """``orchard_sandboxes{tenant,state}`` from a function the scheduler gives (read at scrape)."""

    def __init__(self, counts: Callable[[], Iterable[tuple[str, str, int]]]) -> None:
        self._counts = counts

    def collect(self) -> Iterable[GaugeMetricFamily]:
        family = GaugeMetricFamily(
            "orchard_sandboxes", "Sandboxes by tenant and state", labels=["tenant", "state"]
        )
        for tenant, state, count in self._counts():
            family.add_metric([tenant, state], count)
        yield family


class GaugeCallbackCollector(Collector):
    """Any gauge family read at scrape time (pool sizes and the like)."""

    def __init__(
        self,
        name: str,
        documentation: str,
        labels: list[str],
        values: Callable[[], Iterable[tuple[tuple[str, ...], float]]],
    ) -> None:
        self._name, self._doc, self._labels, self._values = name, documentation, labels, values

    def collect(self) -> Iterable[GaugeMetricFamily]:
        family = GaugeMetricFamily(self._name, self._doc, labels=self._labels)
        for label_values, value in self._values():
            family.add_metric(list(label_values), value)
        yield family


def register_collector(collector: Collector) -> Callable[[], None]:
    """Register on the process registry; returns the undo (tests start services twice)."""
    REGISTRY.register(collector)
    return lambda: REGISTRY.unregister(collector)


METRICS_TOKEN_ENV = "ORCHARD_METRICS_TOKEN_FILE"
"""Overrides where the scrape token is read (the chart mounts its Secret there)."""


def metrics_token_file(home: Path) -> Path:
    """``$ORCHARD_METRICS_TOKEN_FILE``, else ``<home>/secrets/metrics-token``."""
    chosen = os.environ.get(METRICS_TOKEN_ENV)
    return Path(chosen) if chosen else home / "secrets" / "metrics-token"


def load_or_create_metrics_token(path: Path) -> str:
    """The scrape token in ``path``; made (random, 0600, folder 0700) when there is none.

    Services of one home start together: the file is made with O_EXCL, so they all read
    the one that won. A file that exists but holds no token is refused (not replaced)."""
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            pass
        else:
            with os.fdopen(fd, "w") as out:
                out.write(secrets.token_urlsafe(32) + "\n")
    token = path.read_text().strip()
    if len(token) < 16 or not token.isascii() or any(c.isspace() for c in token):
        raise ValueError(f"metrics token file {path} holds no usable token (16+ characters)")
    return token


_WSGI_AUTHORIZATION = "HTTP_AUTHORIZATION"
"""The request's Authorization header in the WSGI environ (a request's, not the process's)."""


class _Quiet(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        """Scrapes and refused knocks write no line to stderr."""


def bearer_app(app: Callable[..., Iterable[bytes]], token: str) -> Callable[..., Iterable[bytes]]:
    """``app`` for requests with ``Authorization: Bearer <token>``; 401 for any other."""
    expected = f"Bearer {token}".encode()

    def guarded(request: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        given = request.get(_WSGI_AUTHORIZATION, "").encode("latin-1", "replace")
        if hmac.compare_digest(given, expected):
            return app(request, start_response)
        start_response(
            "401 Unauthorized",
            [("Content-Type", "text/plain; charset=utf-8"), ("WWW-Authenticate", "Bearer")],
        )
        return [
            b"orchard metrics need 'Authorization: Bearer <token>'; the token is in the "
            b"home's secrets/metrics-token (or $ORCHARD_METRICS_TOKEN_FILE)\n"
        ]

    return guarded


def serve_metrics(listen: str, token_file: Path, address_file: Path | None = None) -> str:
    """Serve ``/metrics`` on ``listen`` ("host:port", port 0 = free) in a daemon thread, to
    scrapers that send the token of ``token_file`` as a bearer token (401 otherwise).

    Why a token and not loopback alone: any local process (and, on Kubernetes, any pod
    the NetworkPolicy lets in) could read tenants' names, sandbox counts and call rates.
    Returns the bound "host:port" and writes it to ``address_file`` if given.
    """
    token = load_or_create_metrics_token(token_file)
    host, _, port_text = listen.rpartition(":")
    host = host.strip("[]") or "127.0.0.1"
    server = make_server(
        host,
        int(port_text or 0),
        bearer_app(make_wsgi_app(REGISTRY), token),
        ThreadingWSGIServer,
        handler_class=_Quiet,
    )
    threading.Thread(target=server.serve_forever, name="metrics", daemon=True).start()
    address = f"{host}:{server.server_port}"
    if address_file is not None:
        write_address_file(address_file, address)
    return address
