"""Running the gateway: key set-up, the scheduler channel, the public server."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from collections.abc import Callable
from dataclasses import dataclass

import grpc
import structlog

from orchard._proto.orchard.v1 import pools_pb2_grpc, sandbox_pb2_grpc
from orchard.common.layout import NodeLayout

from .auth import KEY_FILE, ApiKeyAuth, ensure_dev_key
from .service import GatewayPoolService, GatewayService
from .settings import GatewaySettings

log = structlog.get_logger("orchard.gateway")

CHANNEL_OPTIONS = [
    ("grpc.keepalive_time_ms", 30_000),
    ("grpc.keepalive_permit_without_calls", 1),
]
SERVER_OPTIONS = [
    ("grpc.keepalive_time_ms", 30_000),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.min_ping_interval_without_data_ms", 10_000),
    ("grpc.max_concurrent_streams", 4096),
]


def public_address(listen: str, port: int) -> str:
    host = listen.rsplit(":", 1)[0] if ":" in listen else listen
    if host in ("", "0.0.0.0", "[::]", "::"):
        host = "127.0.0.1"
    return f"{host}:{port}"


@dataclass
class RunningGateway:
    address: str
    server: grpc.aio.Server
    channel: grpc.aio.Channel

    async def stop(self, grace: float) -> None:
        await self.server.stop(grace)
        await self.channel.close(None)
        log.info("gateway stopped")


async def start(settings: GatewaySettings) -> RunningGateway:
    if settings.create_dev_key:
        dev_key = ensure_dev_key(settings.home)
        if dev_key is not None:
            log.info("dev API key", path=str(dev_key))
    channel = grpc.aio.insecure_channel(settings.scheduler, options=CHANNEL_OPTIONS)
    server = grpc.aio.server(options=SERVER_OPTIONS)
    sandboxes = GatewayService(ApiKeyAuth(settings.home / KEY_FILE), channel)
    sandbox_pb2_grpc.add_SandboxServiceServicer_to_server(sandboxes, server)
    pools_pb2_grpc.add_PoolServiceServicer_to_server(GatewayPoolService(sandboxes, channel), server)
    port = server.add_insecure_port(settings.listen)
    if port == 0:
        raise RuntimeError(f"cannot listen on {settings.listen}")
    await server.start()
    address = public_address(settings.listen, port)
    run = NodeLayout(settings.home).run
    run.mkdir(parents=True, exist_ok=True)
    tmp = run / "gateway.addr.tmp"
    tmp.write_text(address + "\n")
    os.replace(tmp, run / "gateway.addr")
    log.info("gateway serving", address=address, scheduler=settings.scheduler)
    return RunningGateway(address, server, channel)


async def serve(settings: GatewaySettings, on_ready: Callable[[str], None] = print) -> None:
    running = await start(settings)
    on_ready(running.address)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    with contextlib.suppress(asyncio.CancelledError):
        await stop.wait()
    await running.stop(settings.shutdown_grace_seconds)
