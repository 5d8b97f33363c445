"""Wiring and running the scheduler: store, backend, recovery, gRPC server, reaper, warm pools.

Start order matters: recovery runs before the port opens, so no client sees a
half-reconciled state. Stop order is the reverse: stop taking calls (with a
grace period for those in flight), stop the pool filler and the reaper, optionally delete every
sandbox, wait for backend work, close the store.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import structlog

from orchard._proto.orchard.v1 import pools_pb2_grpc, sandbox_pb2_grpc
from orchard.common.health_port import HealthPort, start_health_port
from orchard.common.internal_pki import InternalPKI
from orchard.common.layout import NodeLayout
from orchard.common.metrics import metrics_token_file, serve_metrics
from orchard.common.observability import ServerObservability
from orchard.common.service_runner import (
    CONTROL_PLANE_SERVER_OPTIONS,
    ServiceRunner,
    wait_for_stop_signal,
)
from orchard.common.tokens import TokenSigner
from orchard.common.undecodable import UndecodableRequests

from .backends.base import CLOSE, PUSHES_REVOCATIONS, Backend, supports
from .backends.registry import load_backend
from .callers import SCHEDULER_CALLERS
from .disk_full import disk_full_status
from .key_drops import SandboxKeyDrops
from .lifecycle import SandboxLifecycle
from .pool_filler import PoolFiller
from .pool_service import PoolServicer
from .reaper import TtlReaper
from .recovery import reconcile
from .revocations import SandboxRevocations
from .service import SchedulerService
from .settings import SchedulerSettings
from .store import SandboxStore
from .telemetry import register_scheduler_metrics
from .templates import check_runtime_classes, load_templates

log = structlog.get_logger("orchard.scheduler")


@dataclass
class RunningScheduler:
    address: str
    runner: ServiceRunner
    lifecycle: SandboxLifecycle
    reaper: TtlReaper
    store: SandboxStore
    pools: PoolFiller
    unregister_metrics: Callable[[], None] = lambda: None
    owns_backend: bool = False
    """The scheduler loaded the backend itself (not handed one), so it closes it on stop."""
    health_port: HealthPort | None = None
    revocations: SandboxRevocations | None = None
    """Notices to sandboxes with their own executor (None: the backend sends its own)."""
    key_drops: SandboxKeyDrops | None = None
    """Key-drop notices to the same sandboxes (None: the backend sends its own)."""

    async def stop(self, settings: SchedulerSettings) -> None:
        await self.runner.stop(settings.shutdown_grace_seconds)
        if self.health_port is not None:
            await self.health_port.stop()
        self.unregister_metrics()
        if self.revocations is not None:
            await self.revocations.stop()
        if self.key_drops is not None:
            await self.key_drops.stop()
        await self.pools.stop()
        await self.reaper.stop()
        if settings.delete_all_on_shutdown:
            await self.lifecycle.delete_all("the scheduler shut down")
        await self.lifecycle.wait_idle()
        # The backend's own shutdown (the local one stops its egress proxy and
        # removes the bridge and nft tables once no sandbox needs them).
        closing = supports(self.lifecycle.backend, CLOSE)
        if self.owns_backend and closing is not None:
            await closing.close()
        self.store.close()
        log.info("scheduler stopped")


async def start(settings: SchedulerSettings, backend: Backend | None = None) -> RunningScheduler:
    layout = NodeLayout(settings.home)
    layout.run.mkdir(parents=True, exist_ok=True)
    # Read the templates first: a bad file stops the start before anything changes.
    templates = load_templates(settings.home, settings.limits)
    store = SandboxStore(layout.state_db)
    owns_backend = backend is None
    if backend is None:
        backend = load_backend(settings.backend, settings)
    check_runtime_classes(templates, backend)
    signer = TokenSigner(layout.keyring_file())
    lifecycle = SandboxLifecycle(store, backend, signer, settings)
    await reconcile(store, backend)
    # Internal callers prove who they are (a credential signed with their internal
    # certificate, on TLS); only the gateway acts for tenants.
    identity = InternalPKI.of_home(settings.home).identity("scheduler")
    runner = ServiceRunner(
        "scheduler",
        settings.listen,
        options=CONTROL_PLANE_SERVER_OPTIONS,
        interceptors=[UndecodableRequests(), ServerObservability("scheduler")],
        server_credentials=identity.server_credentials(),
        address_file=layout.run / "scheduler.addr",
        translate=disk_full_status,
        authorize=SCHEDULER_CALLERS.authorize(identity.verifier()),
    )
    pools = PoolFiller(lifecycle, templates, settings.pools)
    runner.add_servicer(
        sandbox_pb2_grpc.add_SandboxServiceServicer_to_server,  # type: ignore[arg-type]
        SchedulerService(lifecycle, pools),
        "orchard.v1.SandboxService",
    )
    runner.add_servicer(
        pools_pb2_grpc.add_PoolServiceServicer_to_server,  # type: ignore[arg-type]
        PoolServicer(pools),
        "orchard.v1.PoolService",
    )
    address = await runner.start()
    reaper = TtlReaper(lifecycle, settings.reap_interval_seconds)
    reaper.start()
    pools.start()
    revocations = key_drops = None
    if PUSHES_REVOCATIONS not in backend.capabilities:
        revocations, key_drops = _sandbox_notices(settings, layout, signer, store, lifecycle)
        revocations.start()
        key_drops.start()
    log.info(
        "scheduler serving",
        address=address,
        backend=settings.backend,
        executor=settings.executor_address,
        templates=sorted(templates),
    )
    unregister = register_scheduler_metrics(store, lambda: pools.pools)
    if settings.metrics_listen is not None:
        metrics = serve_metrics(
            settings.metrics_listen,
            metrics_token_file(settings.home),
            layout.run / "scheduler.metrics.addr",
        )
        log.info("scheduler metrics", address=metrics)
    health_port = None
    if settings.health_listen is not None:
        health_port = await start_health_port(runner.health, settings.health_listen)
    await runner.serving()
    return RunningScheduler(
        address,
        runner,
        lifecycle,
        reaper,
        store,
        pools,
        unregister,
        owns_backend,
        health_port,
        revocations,
        key_drops,
    )


def _sandbox_notices(
    settings: SchedulerSettings,
    layout: NodeLayout,
    signer: TokenSigner,
    store: SandboxStore,
    lifecycle: SandboxLifecycle,
) -> tuple[SandboxRevocations, SandboxKeyDrops]:
    """The scheduler's own notices (revocations, dropped token keys), for a backend that
    does not send them (local): a sandbox that cannot be told is removed like an expired
    one."""

    async def remove(sandbox_id: str, why: str) -> None:
        rec = store.get(sandbox_id)
        if rec is not None:
            await lifecycle.remove(rec, why, wait=False)

    revocations = SandboxRevocations(
        layout.revocations,
        signer,
        store,
        remove,
        interval_seconds=settings.revocation_check_seconds,
        give_up_seconds=settings.revocation_give_up_seconds,
    )
    key_drops = SandboxKeyDrops(
        signer,
        store,
        remove,
        interval_seconds=settings.revocation_check_seconds,
        give_up_seconds=settings.revocation_give_up_seconds,
    )
    return revocations, key_drops


async def serve(settings: SchedulerSettings, on_ready: Callable[[str], None] = print) -> None:
    """Run until SIGTERM or SIGINT, then shut down gracefully."""
    running = await start(settings)
    on_ready(running.address)
    await wait_for_stop_signal()
    log.info("scheduler shutting down")
    await running.stop(settings)
