"""How every Orchard gRPC service starts and stops, in one place.

:class:`ServiceRunner` owns one grpc.aio server: the service's options and
interceptors with the error edge (:class:`~orchard.common.service_edge.ServiceErrors`)
always last, the servicers, the standard ``grpc.health.v1`` health service,
the bind (plaintext, or TLS when ``server_credentials`` is given) and the
address file. A service's own start/stop code wraps it with what only it
does (recovery, pools, channels) and calls, in order:

1. ``await runner.start()``: bind and serve; health is NOT_SERVING, so a
   probe does not send traffic to a process still wiring itself up;
2. ``await runner.serving()``: health SERVING and the address file written,
   once everything the service needs is up;
3. ``await runner.stop(grace)``: health NOT_SERVING (permanently), the
   server stopped with ``grace`` seconds for calls in flight, the address
   file removed.

:func:`wait_for_stop_signal` is the one SIGTERM/SIGINT wait of a service's
``serve``.

The health service is grpcio-health-checking's own asyncio servicer (the
reference implementation, the one Kubernetes' ``grpc:`` probes and
``grpc_health_probe`` are tested against) rather than ours. Its ``Check``
answers for ``""`` (the whole process) and for each full service name added
here; a ``Watch`` stream is an open call, so it holds ``stop`` for the grace
period like any other.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1.health import aio as health_aio  # type: ignore[attr-defined]  # not in grpc-stubs

from .address_file import public_address, remove_address_file, write_address_file
from .service_edge import Authorize, ServiceErrors, Translate
from .tls import scheme_address

CLIENT_PINGS_SERVER_OPTIONS = [
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.min_ping_interval_without_data_ms", 5_000),
]
"""Every server's (the runner adds them; a service's own options come after and win): accept
the keepalive pings the SDK and the services send (every 30 s, on idle channels too). gRPC's
server default takes more than one ping per 5 minutes while it sends no data as abuse and,
after two strikes, ends the connection with GOAWAY ``too_many_pings``: an exec that printed
nothing for 150 s (a harness waiting on a slow model, a quiet build), or a grading that
took as long, was lost with it."""

CONTROL_PLANE_SERVER_OPTIONS = [
    ("grpc.keepalive_time_ms", 30_000),
    ("grpc.max_concurrent_streams", 4096),
]
"""The gateway's and the scheduler's server options: keepalive pings find dead
clients of long-lived channels, and one connection may carry thousands of calls
(a trainer's creates at once); the executor and rewards set their own."""


def _with_defaults(
    options: Sequence[tuple[str, Any]], defaults: Sequence[tuple[str, Any]]
) -> list[tuple[str, Any]]:
    """``options`` plus each default they do not set (no key given twice to gRPC)."""
    given = {key for key, _ in options}
    return [*(d for d in defaults if d[0] not in given), *options]


OVERALL = ""
"""The health service name that stands for the whole process."""


class ServiceRunner:
    """One service's grpc.aio server, from bind to graceful stop (see the module doc)."""

    def __init__(
        self,
        name: str,
        listen: str,
        *,
        options: Sequence[tuple[str, Any]] = (),
        interceptors: Sequence[grpc.aio.ServerInterceptor] = (),  # type: ignore[type-arg]
        server_credentials: grpc.ServerCredentials | None = None,
        address_file: Path | None = None,
        translate: Translate | None = None,
        announce_tls: bool = False,
        authorize: Authorize | None = None,
    ) -> None:
        """``announce_tls``: the address (and its file) say ``grpcs://`` (the gateway's and the
        rewards service's endpoints, which clients parse); the executor's stays bare (the
        control plane tells clients it speaks TLS in ``ExecutorAccess.tls``). ``authorize``:
        an internal service's caller check (``caller_policy``), run before every handler,
        the health service's included."""
        self.name = name
        self.listen = listen
        self.server_credentials = server_credentials
        self.address_file = address_file
        self.announce_tls = announce_tls and server_credentials is not None
        self.address = ""
        self.server = grpc.aio.server(
            options=_with_defaults(options, CLIENT_PINGS_SERVER_OPTIONS),
            interceptors=[*interceptors, ServiceErrors(name, translate, authorize)],
        )
        self.health = health_aio.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self.server)
        self._services: list[str] = [OVERALL]

    def add_servicer(
        self, add_to_server: Callable[[Any, grpc.aio.Server], None], servicer: Any, service: str
    ) -> None:
        """Register a generated servicer (``add_XServicer_to_server``) serving ``service``
        (its full name, e.g. ``orchard.v1.SandboxService``, as health checks ask for it)."""
        add_to_server(servicer, self.server)
        self._services.append(service)

    def add_handlers(self, *handlers: grpc.GenericRpcHandler) -> None:  # type: ignore[type-arg]
        """Register generic handlers (each names its service, as ``method_handlers_generic_handler`` does)."""
        self.server.add_generic_rpc_handlers(handlers)
        for handler in handlers:
            name = getattr(handler, "service_name", None)
            if callable(name):
                self._services.append(str(name()))

    async def _set_all(self, status: int) -> None:
        for service in self._services:
            await self.health.set(service, status)  # type: ignore[arg-type]

    async def start(self) -> str:
        """Bind and serve (health NOT_SERVING until :meth:`serving`); returns the address."""
        await self._set_all(health_pb2.HealthCheckResponse.NOT_SERVING)
        if self.server_credentials is None:
            port = self.server.add_insecure_port(self.listen)
        else:
            port = self.server.add_secure_port(self.listen, self.server_credentials)
        if port == 0:
            raise OSError(f"the {self.name} cannot listen on {self.listen}")
        await self.server.start()
        self.address = scheme_address(public_address(self.listen, port), self.announce_tls)
        return self.address

    async def serving(self) -> None:
        """Health SERVING and the address file written: the service is ready for calls."""
        await self._set_all(health_pb2.HealthCheckResponse.SERVING)
        if self.address_file is not None:
            write_address_file(self.address_file, self.address)

    async def stop(self, grace: float | None) -> None:
        """Health NOT_SERVING, stop with ``grace`` seconds for calls in flight, remove the file."""
        await self.health.enter_graceful_shutdown()
        await self.server.stop(grace)
        if self.address_file is not None:
            remove_address_file(self.address_file, self.address)


async def wait_for_stop_signal() -> None:
    """Return on the first SIGTERM or SIGINT (or when the waiting task is cancelled).

    The handlers stay installed: a second signal during the graceful stop is
    ignored rather than killing the process half-way through it.
    """
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    with contextlib.suppress(asyncio.CancelledError):
        await stop.wait()
