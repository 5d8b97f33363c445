"""gRPC channels, reused per address (one HTTP/2 connection serves many calls).

Sync channels are shared process-wide. grpc.aio channels belong to one event
loop, so they are cached per loop (a weak map: a closed loop's channels go
with it).
"""

from __future__ import annotations

import asyncio
import threading
import weakref

import grpc

CHANNEL_OPTIONS: list[tuple[str, int]] = [
    # Keep idle connections alive through NATs and notice dead peers in ~40 s.
    ("grpc.keepalive_time_ms", 30_000),
    ("grpc.keepalive_timeout_ms", 10_000),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.max_pings_without_data", 0),
    ("grpc.max_receive_message_length", 64 * 1024 * 1024),
    ("grpc.max_send_message_length", 64 * 1024 * 1024),
]

_lock = threading.Lock()
_sync: dict[str, grpc.Channel] = {}
_async: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[str, grpc.aio.Channel]] = (
    weakref.WeakKeyDictionary()
)


def sync_channel(address: str) -> grpc.Channel:
    with _lock:
        channel = _sync.get(address)
        if channel is None:
            channel = _sync[address] = grpc.insecure_channel(address, options=CHANNEL_OPTIONS)
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


def close_all() -> None:
    """Close the shared sync channels (tests, or a process about to fork)."""
    with _lock:
        channels = list(_sync.values())
        _sync.clear()
    for channel in channels:
        channel.close()
