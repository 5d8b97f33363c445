"""The default clients behind ``Sandbox.create(...)`` and the other classmethods.

The classmethods keep the README's first lines short (no client to make). Each
call resolves the configuration as a client would (arguments, environment,
the local stack's files: they may change between calls, e.g. a restarted
stack) and reuses one client per resolved configuration, so channels are
shared as before. Code that wants control over channels, TLS, interceptors or
a fake transport makes its own :class:`Orchard` / :class:`AsyncOrchard`.
"""

from __future__ import annotations

import threading

from ._async_client import AsyncOrchard
from ._config import ClientConfig
from ._sync_client import Orchard

_lock = threading.Lock()
_sync: dict[ClientConfig, Orchard] = {}
_async: dict[ClientConfig, AsyncOrchard] = {}


def default_client(endpoint: str | None = None, api_key: str | None = None) -> Orchard:
    """The shared sync client for this configuration."""
    config = ClientConfig.resolve(endpoint, api_key)
    client = _sync.get(config)
    if client is None:
        with _lock:
            client = _sync.get(config)
            if client is None:
                client = _sync[config] = Orchard.from_config(config)
    return client


def default_async_client(endpoint: str | None = None, api_key: str | None = None) -> AsyncOrchard:
    """The shared asyncio client for this configuration (its channels are per event loop)."""
    config = ClientConfig.resolve(endpoint, api_key)
    client = _async.get(config)
    if client is None:
        with _lock:
            client = _async.get(config)
            if client is None:
                client = _async[config] = AsyncOrchard.from_config(config)
    return client


def close_default_clients() -> None:
    """Close the default sync clients' channels (tests, or a process about to fork)."""
    with _lock:
        clients = list(_sync.values())
        _sync.clear()
    for client in clients:
        client.close()
