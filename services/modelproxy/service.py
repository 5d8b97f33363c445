"""Running the model proxy: the gateway channel, the upstream client, the HTTP server."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import structlog
from aiohttp import web

from orchard.common.address_file import public_address, remove_address_file, write_address_file
from orchard.common.service_runner import wait_for_stop_signal
from orchard.common.tls import aio_channel, upstream_credentials

from .server import ModelProxy
from .sessions import SessionStore
from .settings import ModelProxySettings
from .tenant_keys import TenantKeys
from .upstream import Upstream

log = structlog.get_logger("orchard.modelproxy")


async def serve(
    settings: ModelProxySettings,
    on_ready: Callable[[str], None] = print,
    extra_body: dict[str, Any] | None = None,
) -> None:
    credentials = upstream_credentials(settings.gateway_ca) if settings.gateway_ca else None
    channel = aio_channel(settings.gateway, credentials)
    upstream = Upstream(settings.upstream, settings.upstream_kind, settings.upstream_api_key,
                        settings.upstream_timeout_seconds, extra_body,
                        settings.max_answer_bytes)  # fmt: skip
    await upstream.start()
    store = SessionStore(
        settings.data_dir / "sessions", settings.max_calls_per_session,
        settings.max_session_bytes, settings.max_open_sessions_per_tenant,
    )  # fmt: skip
    proxy = ModelProxy(settings, store, TenantKeys(channel, settings.key_cache_seconds), upstream)
    runner = web.AppRunner(proxy.app(), access_log=None, handle_signals=False)
    await runner.setup()
    host, _, port = settings.listen.rpartition(":")
    site = web.TCPSite(runner, host or "127.0.0.1", int(port), backlog=1024)
    await site.start()
    bound = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    address = public_address(settings.listen, bound)
    if not proxy.public_url:
        proxy.public_url = f"http://{address}"
    address_file = settings.home / "run" / "modelproxy.addr"
    write_address_file(address_file, f"http://{address}")
    log.info("modelproxy serving", address=address, upstream=settings.upstream,
             kind=settings.upstream_kind, sessions=str(store.root))  # fmt: skip
    on_ready(f"http://{address}")
    await wait_for_stop_signal()
    await runner.cleanup()
    await upstream.close()
    await channel.close(None)
    for session in store.all():
        session.calls.sync()
        session.calls.close()
    remove_address_file(address_file, f"http://{address}")
    log.info("modelproxy stopped")
