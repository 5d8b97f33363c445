"""Running the rewards service: the gateway channel, the judge, the gRPC server."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from collections.abc import Callable

import grpc
import structlog

from orchard._proto.orchard.v1 import rewards_pb2_grpc
from orchard.common.tls import add_port, aio_channel, scheme_address, upstream_credentials
from orchard.common.undecodable import UndecodableRequests

from .auth import KeyCheck
from .judge.client import Judge
from .service import RewardService
from .settings import RewardSettings

log = structlog.get_logger("orchard.rewards")


def public_address(listen: str, port: int) -> str:
    host = listen.rsplit(":", 1)[0] if ":" in listen else listen
    if host in ("", "0.0.0.0", "[::]", "::"):
        host = "127.0.0.1"
    return f"{host}:{port}"


async def serve(settings: RewardSettings, on_ready: Callable[[str], None] = print) -> None:
    credentials = None
    if settings.gateway_ca is not None or settings.tls is not None:
        credentials = upstream_credentials(settings.gateway_ca, settings.tls)
    channel = aio_channel(settings.gateway, credentials)
    judge = Judge(settings.judge)
    server = grpc.aio.server(
        options=[("grpc.max_receive_message_length", 20 * 1024 * 1024)],
        interceptors=[UndecodableRequests()],
    )
    rewards_pb2_grpc.add_RewardServiceServicer_to_server(
        RewardService(settings, KeyCheck(channel, settings.key_cache_seconds), judge), server
    )
    port = add_port(server, settings.listen, settings.tls)
    if port == 0:
        raise RuntimeError(f"cannot listen on {settings.listen}")
    await server.start()
    address = scheme_address(public_address(settings.listen, port), settings.tls is not None)
    run = settings.home / "run"
    run.mkdir(parents=True, exist_ok=True)
    tmp = run / "rewards.addr.tmp"
    tmp.write_text(address + "\n")
    os.replace(tmp, run / "rewards.addr")
    log.info(
        "rewards serving", address=address, gateway=settings.gateway, judge=settings.judge.base_url
    )
    on_ready(address)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    await stop.wait()
    await server.stop(settings.shutdown_grace_seconds)
    await judge.close()
    await channel.close(None)
    with contextlib.suppress(FileNotFoundError):
        (run / "rewards.addr").unlink()
    log.info("rewards stopped")
