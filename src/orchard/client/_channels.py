"""gRPC channels and stubs, reused per address (one HTTP/2 connection serves many calls).

Sync channels are shared process-wide. grpc.aio channels belong to one event
loop, so they are cached per loop (a weak map: a closed loop's channels go
with it). Stubs are cached beside their channel: building an
ExecutorServiceStub creates a callable per method (~30 us), which was a
measurable part of a ~1.5 ms exec when done on every call.
"""

from __future__ import annotations

import asyncio
import threading
import weakref
from collections.abc import Callable
from typing import Any, TypeAlias, TypeVar

import grpc

CHANNEL_OPTIONS: list[tuple[str, int]] = [
    # Keep idle connections alive through NATs and notice dead peers in ~40 s.
    ("grpc.keepalive_time_ms", 30_000),
    ("grpc.keepalive_timeout_ms", 10_000),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.max_pings_without_data", 0),
    ("grpc.max_receive_message_length", 64 * 1024 * 1024),
    ("grpc.max_send_message_length", 64 * 1024 * 1024),
    # A restarted gateway or executor (``orchard up`` restarts a dead one on the
    # same address) is reached again within a second; gRPC's default reconnect
    # backoff grows past that and kept answering UNAVAILABLE after it was back.
    ("grpc.initial_reconnect_backoff_ms", 200),
    ("grpc.min_reconnect_backoff_ms", 200),
    ("grpc.max_reconnect_backoff_ms", 1000),
]

StubT = TypeVar("StubT")
# grpc's interceptor classes are generic only in its stubs: keep the subscripts out of runtime.
SyncInterceptor: TypeAlias = (
    "grpc.UnaryUnaryClientInterceptor[Any, Any]"
    " | grpc.UnaryStreamClientInterceptor[Any, Any]"
    " | grpc.StreamUnaryClientInterceptor[Any, Any]"
    " | grpc.StreamStreamClientInterceptor[Any, Any]"
)

_lock = threading.Lock()
_sync: dict[str, grpc.Channel] = {}
_async: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[str, grpc.aio.Channel]] = (
    weakref.WeakKeyDictionary()
)
_sync_stubs: dict[tuple[str, Any], Any] = {}
_sync_interceptors: tuple[SyncInterceptor, ...] = ()
_async_stubs: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[tuple[str, Any], Any]] = (
    weakref.WeakKeyDictionary()
)


def set_sync_interceptors(*interceptors: SyncInterceptor) -> None:
    """Wrap every sync channel made from now on with these client interceptors.

    The hook for cross-cutting client work the SDK does not do itself, e.g. a
    load generator (Locust) timing each call. Cached channels and stubs are
    dropped, so the next call of any ``Sandbox`` goes through the interceptors.
    No arguments: plain channels again.
    """
    global _sync_interceptors
    close_all()
    with _lock:
        _sync_interceptors = tuple(interceptors)


def sync_channel(address: str) -> grpc.Channel:
    with _lock:
        channel = _sync.get(address)
        if channel is None:
            channel = grpc.insecure_channel(address, options=CHANNEL_OPTIONS)
            if _sync_interceptors:
                channel = grpc.intercept_channel(channel, *_sync_interceptors)
            _sync[address] = channel
        return channel


def async_channel(address: str) -> grpc.aio.Channel:
    loop = asyncio.get_running_loop()
    with _lock:
        per_loop = _async.setdefault(loop, {})
        channel = per_loop.get(address)
        if channel is None:
            channel = per_loop[address] = grpc.aio.insecure_channel(
                address, options=CHANNEL_OPTIONS
            )
        return channel


def sync_stub(address: str, make: Callable[[grpc.Channel], StubT]) -> StubT:
    """``make(channel)`` for the shared sync channel to ``address``, built once."""
    key = (address, make)
    stub = _sync_stubs.get(key)
    if stub is None:
        stub = make(sync_channel(address))
        with _lock:
            stub = _sync_stubs.setdefault(key, stub)
    return stub  # type: ignore[no-any-return]


def async_stub(address: str, make: Callable[[grpc.aio.Channel], StubT]) -> StubT:
    """``make(channel)`` for this loop's grpc.aio channel to ``address``, built once."""
    loop = asyncio.get_running_loop()
    key = (address, make)
    per_loop = _async_stubs.get(loop)
    stub = per_loop.get(key) if per_loop is not None else None
    if stub is None:
        stub = make(async_channel(address))
        with _lock:
            stub = _async_stubs.setdefault(loop, {}).setdefault(key, stub)
    return stub  # type: ignore[no-any-return]


def close_all() -> None:
    """Close the shared sync channels (tests, or a process about to fork)."""
    with _lock:
        channels = list(_sync.values())
        _sync.clear()
        _sync_stubs.clear()
    for channel in channels:
        channel.close()
