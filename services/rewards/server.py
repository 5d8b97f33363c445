"""Running the rewards service: the gateway channel, the judge, the gRPC server."""

from __future__ import annotations

from collections.abc import Callable

import structlog

from orchard._proto.orchard.v1 import rewards_pb2_grpc
from orchard.common.service_runner import ServiceRunner, wait_for_stop_signal
from orchard.common.tls import aio_channel, server_credentials, upstream_credentials
from orchard.common.undecodable import UndecodableRequests

from .auth import KeyCheck
from .judge.client import Judge
from .service import RewardService
from .settings import RewardSettings

log = structlog.get_logger("orchard.rewards")


async def serve(settings: RewardSettings, on_ready: Callable[[str], None] = print) -> None:
    credentials = None
    if settings.gateway_ca is not None or settings.tls is not None:
        credentials = upstream_credentials(settings.gateway_ca, settings.tls)
    channel = aio_channel(settings.gateway, credentials)
    judge = Judge(settings.judge)
    runner = ServiceRunner(
        "rewards",
        settings.listen,
        options=[("grpc.max_receive_message_length", 20 * 1024 * 1024)],
        interceptors=[UndecodableRequests()],
        server_credentials=server_credentials(settings.tls, settings.listen),
        address_file=settings.home / "run" / "rewards.addr",
        announce_tls=True,
    )
    runner.add_servicer(
        rewards_pb2_grpc.add_RewardServiceServicer_to_server,  # type: ignore[arg-type]
        RewardService(settings, KeyCheck(channel, settings.key_cache_seconds), judge),
        "orchard.v1.RewardService",
    )
    address = await runner.start()
    await runner.serving()
    log.info(
        "rewards serving", address=address, gateway=settings.gateway, judge=settings.judge.base_url
    )
    on_ready(address)
    await wait_for_stop_signal()
    await runner.stop(settings.shutdown_grace_seconds)
    await judge.close()
    await channel.close(None)
    log.info("rewards stopped")
