"""The transport seam: where the SDK gets a gRPC channel for an address.

Everything above this module builds requests, calls stubs and parses answers;
this module only decides what a channel to ``address`` is. That is the one
place a client is configured for the wire (credentials, interceptors, channel
options) and the one place a test swaps the wire for something in-process
(``orchard.testing``'s fake hands out channels that route calls to fake
servicers), the way httpx's ``Client(transport=)`` takes ``MockTransport``.

A transport returns objects that behave like ``grpc.Channel`` (sync) or
``grpc.aio.Channel`` (asyncio): the generated stubs are built over them, so a
fake only implements the four multi-callable factories.

Channels are made once per address (one HTTP/2 connection serves many calls).
grpc.aio channels belong to one event loop, so the async transport keeps them
per loop (a weak map: a closed loop's channels go with it).
"""

from __future__ import annotations

import asyncio
import threading
import weakref
from collections.abc import Sequence
from typing import Any, Protocol, TypeAlias, runtime_checkable

import grpc

from ._tls import split_address

DEFAULT_CHANNEL_OPTIONS: tuple[tuple[str, int], ...] = (
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
    # Not grpc.min_reconnect_backoff_ms: gRPC core takes it as the deadline of a
    # connection attempt, handshake included (grpc/grpc#33423), so at 200 ms a server slow to
    # send its SETTINGS (a loaded machine, a runsc sandbox's executor) was UNAVAILABLE at the
    # first call. Left out, an attempt gets gRPC's 20 s (tests/sdk/test_channel_options.py).
    ("grpc.max_reconnect_backoff_ms", 1000),
)

# grpc's interceptor classes are generic only in its type stubs: keep the subscripts out of runtime.
Interceptor: TypeAlias = (
    "grpc.UnaryUnaryClientInterceptor[Any, Any]"
    " | grpc.UnaryStreamClientInterceptor[Any, Any]"
    " | grpc.StreamUnaryClientInterceptor[Any, Any]"
    " | grpc.StreamStreamClientInterceptor[Any, Any]"
)
"""A sync client interceptor (``grpc.intercept_channel`` applies it to every call)."""
AsyncInterceptor: TypeAlias = "grpc.aio.ClientInterceptor"
"""A grpc.aio client interceptor (``grpc.aio.UnaryUnaryClientInterceptor`` and friends)."""


@runtime_checkable
class Transport(Protocol):
    """What a sync client needs of the wire."""

    def channel(self, address: str) -> grpc.Channel:
        """A channel to ``address`` (host:port); the same one each time for one address."""
        ...

    def close(self) -> None:
        """Close every channel this transport made."""
        ...


@runtime_checkable
class AsyncTransport(Protocol):
    """What an asyncio client needs of the wire."""

    def channel(self, address: str) -> grpc.aio.Channel:
        """This event loop's channel to ``address``; called inside a running loop."""
        ...

    async def close(self) -> None:
        """Close the channels of the running loop (others close with their loop)."""
        ...


class GrpcTransport:
    """Real gRPC channels: TLS for ``grpcs://host:port`` addresses (with ``credentials``, or the
    system's roots when None), plaintext for a bare ``host:port``, ``grpc://`` and ``unix:``.
    The client writes every address it hands over that way (``_tls.resolve_endpoint``,
    ``ExecutorAccess.tls``), so one client can reach a TLS gateway and a plaintext
    ``unix:`` executor.

    ``interceptors`` wrap every channel (``grpc.intercept_channel``): timing in a
    load generator, tracing, retries. ``options`` replace the defaults above.
    """

    def __init__(
        self,
        *,
        credentials: grpc.ChannelCredentials | None = None,
        interceptors: Sequence[Interceptor] = (),
        options: Sequence[tuple[str, Any]] = DEFAULT_CHANNEL_OPTIONS,
    ) -> None:
        self.credentials = credentials
        self.interceptors = tuple(interceptors)
        self.options = list(options)
        self._lock = threading.Lock()
        self._channels: dict[str, grpc.Channel] = {}

    def channel(self, address: str) -> grpc.Channel:
        channel = self._channels.get(address)
        if channel is not None:
            return channel
        with self._lock:
            channel = self._channels.get(address)
            if channel is None:
                target, secure = split_address(address)
                if secure:
                    credentials = self.credentials or grpc.ssl_channel_credentials()
                    channel = grpc.secure_channel(target, credentials, options=self.options)
                else:
                    channel = grpc.insecure_channel(target, options=self.options)
                if self.interceptors:
                    channel = grpc.intercept_channel(channel, *self.interceptors)
                self._channels[address] = channel
            return channel

    def close(self) -> None:
        with self._lock:
            channels = list(self._channels.values())
            self._channels.clear()
        for channel in channels:
            channel.close()


class AsyncGrpcTransport:
    """Real grpc.aio channels, kept per event loop; see :class:`GrpcTransport`."""

    def __init__(
        self,
        *,
        credentials: grpc.ChannelCredentials | None = None,
        interceptors: Sequence[AsyncInterceptor] = (),
        options: Sequence[tuple[str, Any]] = DEFAULT_CHANNEL_OPTIONS,
    ) -> None:
        self.credentials = credentials
        self.interceptors = tuple(interceptors)
        self.options = list(options)
        self._channels: weakref.WeakKeyDictionary[
            asyncio.AbstractEventLoop, dict[str, grpc.aio.Channel]
        ] = weakref.WeakKeyDictionary()

    def channel(self, address: str) -> grpc.aio.Channel:
        loop = asyncio.get_running_loop()
        per_loop = self._channels.get(loop)
        if per_loop is None:
            per_loop = self._channels[loop] = {}
        channel = per_loop.get(address)
        if channel is None:
            interceptors = list(self.interceptors) or None
            target, secure = split_address(address)
            if secure:
                channel = grpc.aio.secure_channel(
                    target,
                    self.credentials or grpc.ssl_channel_credentials(),
                    options=self.options,
                    interceptors=interceptors,
                )
            else:
                channel = grpc.aio.insecure_channel(
                    target, options=self.options, interceptors=interceptors
                )
            per_loop[address] = channel
        return channel

    async def close(self) -> None:
        per_loop = self._channels.pop(asyncio.get_running_loop(), {})
        for channel in per_loop.values():
            await channel.close(None)
