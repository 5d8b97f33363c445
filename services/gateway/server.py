"""Running the gateway: key set-up, the scheduler channel, the public gRPC and REST fronts."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import grpc
import structlog

from orchard._proto.orchard.v1 import pools_pb2
from orchard.common.address_file import remove_address_file, write_address_file
from orchard.common.health_port import HealthPort, start_health_port
from orchard.common.internal_pki import InternalPKI
from orchard.common.layout import NodeLayout
from orchard.common.metrics import metrics_token_file, serve_metrics
from orchard.common.observability import OutgoingContextInterceptor, ServerObservability
from orchard.common.quotas import QUOTA_FILE, QuotaFile
from orchard.common.service_runner import (
    CONTROL_PLANE_SERVER_OPTIONS,
    ServiceRunner,
    wait_for_stop_signal,
)
from orchard.common.tls import server_credentials, upstream_credentials
from orchard.common.tokens import Revocations, TokenSigner
from orchard.common.undecodable import UndecodableRequests

from .auth import KEY_FILE, ApiKeyAuth, ensure_dev_key
from .proxy import ControlPlaneOnly, DataPlaneProxy
from .rest import RunningRest, start_rest
from .service import GatewayService, forwarding_handler
from .settings import GatewaySettings

log = structlog.get_logger("orchard.gateway")

CHANNEL_OPTIONS = [
    ("grpc.keepalive_time_ms", 30_000),
    ("grpc.keepalive_permit_without_calls", 1),
    # A restarted scheduler is reached again within a second (gRPC's default
    # reconnect backoff grows to minutes: clients saw UNAVAILABLE for ~5 s).
    ("grpc.initial_reconnect_backoff_ms", 200),
    # Not grpc.min_reconnect_backoff_ms: gRPC core takes it as the deadline of a
    # connection attempt, handshake included (grpc/grpc#33423), so at 200 ms a server slow to
    # send its SETTINGS (a loaded machine, a runsc sandbox's executor) was UNAVAILABLE at the
    # first call. Left out, an attempt gets gRPC's 20 s (tests/sdk/test_channel_options.py).
    ("grpc.max_reconnect_backoff_ms", 1000),
]


@dataclass
class RunningGateway:
    address: str
    runner: ServiceRunner
    channel: grpc.aio.Channel
    service: GatewayService
    rest: RunningRest | None = None
    metrics_address: str | None = None
    proxy: DataPlaneProxy | None = None
    http_address_file: Path | None = None
    internal_dir: Path | None = None
    """The private folder of the socket the REST front reaches the gRPC port by."""
    health_port: HealthPort | None = None

    @property
    def http_address(self) -> str | None:
        return None if self.rest is None else self.rest.address

    async def stop(self, grace: float) -> None:
        await self.runner.health.enter_graceful_shutdown()
        if self.rest is not None:
            await self.rest.stop()
            if self.http_address_file is not None:
                remove_address_file(self.http_address_file, self.rest.address)
        await self.runner.stop(grace)
        if self.health_port is not None:
            await self.health_port.stop()
        if self.proxy is not None:
            await self.proxy.close()
        await self.channel.close(None)
        if self.internal_dir is not None:
            shutil.rmtree(self.internal_dir, ignore_errors=True)
        log.info("gateway stopped")


def _node_signer(home: Path) -> TokenSigner | None:
    """The node's token key when this gateway shares the node's home, so the proxy can
    refuse a forged token before asking the scheduler anything; else None (the executor
    still verifies every token)."""
    layout = NodeLayout(home)
    if not (layout.token_keyring.exists() or layout.token_key.exists()):
        return None
    return TokenSigner(layout.keyring_file(), Revocations(layout.revocations))


async def start(settings: GatewaySettings) -> RunningGateway:
    if settings.create_dev_key:
        dev_key = ensure_dev_key(settings.home)
        if dev_key is not None:
            log.info("dev API key", path=str(dev_key))
    # The scheduler admits only calls signed with the gateway's internal certificate.
    identity = InternalPKI.of_home(settings.home).identity("gateway")
    channel = identity.aio_channel(
        "scheduler",
        settings.scheduler,
        options=CHANNEL_OPTIONS,
        interceptors=[OutgoingContextInterceptor()],
    )
    run = NodeLayout(settings.home).run
    runner = ServiceRunner(
        "gateway",
        settings.listen,
        options=CONTROL_PLANE_SERVER_OPTIONS,
        interceptors=[ControlPlaneOnly(UndecodableRequests(), ServerObservability("gateway"))],
        server_credentials=server_credentials(settings.tls, settings.listen),
        address_file=run / "gateway.addr",
        announce_tls=True,
    )
    tenants_dir = settings.tenants_dir or settings.home
    service = GatewayService(
        ApiKeyAuth(tenants_dir / KEY_FILE),
        channel,
        QuotaFile(tenants_dir / QUOTA_FILE),
        create_slots=settings.create_slots,
    )
    pool_service = pools_pb2.DESCRIPTOR.services_by_name["PoolService"]
    runner.add_handlers(forwarding_handler(service), forwarding_handler(service, pool_service))
    executor_credentials = None
    if settings.tls is not None or settings.upstream_ca is not None:
        executor_credentials = upstream_credentials(settings.upstream_ca, settings.tls)
    proxy = None
    if settings.data_plane_proxy:
        proxy = DataPlaneProxy(channel, _node_signer(settings.home), executor_credentials)
        runner.add_handlers(proxy.handler())
    internal_dir = None
    if settings.http_listen is not None:
        # The REST front calls this server over a socket only this process can reach
        # (0700 folder): no TLS to itself, and no certificate that must name 127.0.0.1.
        internal_dir = Path(tempfile.mkdtemp(prefix="orchard-gateway-"))
        internal = f"unix:{internal_dir / 'grpc.sock'}"
        if runner.server.add_insecure_port(internal) == 0:
            raise RuntimeError(f"cannot listen on {internal}")
    address = await runner.start()
    running = RunningGateway(
        address, runner, channel, service, proxy=proxy, internal_dir=internal_dir
    )
    if settings.http_listen is not None and internal_dir is not None:
        running.rest = await start_rest(
            settings.http_listen,
            f"unix:{internal_dir / 'grpc.sock'}",
            service.auth.tenant_for,
            settings.tls.ssl_context() if settings.tls is not None else None,
            executor_credentials,
        )
        running.http_address_file = run / "gateway-http.addr"
        write_address_file(running.http_address_file, running.rest.address)
    if settings.metrics_listen is not None:
        running.metrics_address = serve_metrics(
            settings.metrics_listen,
            metrics_token_file(settings.home),
            run / "gateway.metrics.addr",
        )
    if settings.health_listen is not None:
        running.health_port = await start_health_port(runner.health, settings.health_listen)
    await runner.serving()
    log.info(
        "gateway serving",
        address=address,
        http=running.http_address,
        metrics=running.metrics_address,
        scheduler=settings.scheduler,
        tls=settings.tls is not None,
        mutual_tls=settings.tls is not None and settings.tls.mutual,
    )
    return running


async def serve(settings: GatewaySettings, on_ready: Callable[[str], None] = print) -> None:
    running = await start(settings)
    on_ready(running.address)
    await wait_for_stop_signal()
    await running.stop(settings.shutdown_grace_seconds)
