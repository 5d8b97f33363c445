"""The data-plane proxy: the gateway also serves ExecutorService, forwarding bytes.

By default a client reaches a sandbox's node executor directly (the address
and a per-sandbox token come with the sandbox). Where the executors are not
reachable from the client (another network, one public port), the client sets
``ORCHARD_DATA_PLANE=proxy`` and sends its data-plane calls to the gateway;
this module forwards each one to the executor that serves the sandbox.

Why bytes: every ExecutorService method is served by a generic handler whose
(de)serializers are the identity, so a request or response is never decoded
or re-encoded here; the proxy only moves frames. Which executor: the sandbox
id and tenant are read from the call's data-plane token (``authorization:
Bearer <token>``), whose signature is checked here with the node key when the
gateway can read it (the embedded default shares one home), then the
executor's address is asked of the scheduler (GetSandbox as that tenant) and
cached. The executor still verifies the token against the request's own
sandbox id, so the check is end to end: a token routes a call, it does not
authorize a different sandbox.

Streams: each upstream call is driven by the handler's task, so HTTP/2 flow
control gives back-pressure both ways (a response is read from the executor
only when the previous one was written to the client; requests are pulled
from the client only as the executor takes them). The caller's deadline is
passed on, its metadata forwarded (minus transport headers), and a client
that goes away cancels the handler, which cancels the upstream call.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import re
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import grpc
import structlog

from orchard._proto.orchard.v1 import executor_pb2, sandbox_pb2
from orchard.common.errors import ServiceError
from orchard.common.service_edge import PassedOnStatus
from orchard.common.tls import aio_channel, scheme_address
from orchard.common.tokens import TokenError, TokenSigner, unverified_claims

log = structlog.get_logger("orchard.gateway.proxy")

EXECUTOR_SERVICE = executor_pb2.DESCRIPTOR.services_by_name["ExecutorService"]
PROXIED_PREFIX = f"/{EXECUTOR_SERVICE.full_name}/"
TENANT_KEY = "orchard-tenant"
# Metadata that belongs to one hop, not to the call.
TENANT_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
HOP_HEADERS = frozenset({"user-agent", "te", "content-type"})
# How long an executor address is trusted without asking the scheduler again.
ROUTE_TTL_SECONDS = 30.0
MAX_ROUTES = 8192
MAX_TOKEN_CHARS = 1024
MAX_UPSTREAM_CHANNELS = 512
# A retired channel's calls in flight get this long before they are cancelled.
RETIRE_GRACE_SECONDS = 600.0
UPSTREAM_OPTIONS = [
    ("grpc.keepalive_time_ms", 30_000),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.max_receive_message_length", 64 * 1024 * 1024),
    ("grpc.max_send_message_length", 64 * 1024 * 1024),
]

Context = grpc.aio.ServicerContext[Any, Any]


class ControlPlaneOnly(grpc.aio.ServerInterceptor):  # type: ignore[type-arg]
    """Runs the server's interceptors for every call except the proxied ExecutorService ones.

    A proxied call is a pass-through: its bytes are never decoded here (so the
    undecodable-request guard has nothing to guard), and the executor that
    serves it records its metrics, span and logs under the same request id
    (the metadata is forwarded). Skipping them keeps ~0.1 ms of CPU off each
    proxied call, on a hop whose whole budget is 0.3 ms. The service edge is
    not among them (the ServiceRunner puts it after this): a proxied call's
    errors leave with their reason and fault trailers like any other.
    """

    def __init__(self, *interceptors: Any) -> None:
        self.interceptors = interceptors

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[Any]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> Any:
        if handler_call_details.method.startswith(PROXIED_PREFIX):
            return await continuation(handler_call_details)
        call = continuation
        for interceptor in reversed(self.interceptors):
            call = functools.partial(interceptor.intercept_service, call)
        return await call(handler_call_details)


def _identity(data: bytes) -> bytes:
    return data


@dataclass(frozen=True, slots=True)
class Route:
    """Where one token's calls go: its sandbox, tenant and executor address."""

    sandbox_id: str
    tenant: str
    address: str
    expires: float


def _unauthenticated(message: str) -> ServiceError:
    return ServiceError(grpc.StatusCode.UNAUTHENTICATED, "TOKEN_INVALID", message)


def bearer_of(metadata: Any) -> str:
    """The data-plane token of the call (UNAUTHENTICATED if absent or malformed)."""
    for key, value in metadata or ():
        if key == "authorization":
            text = value.decode() if isinstance(value, bytes) else str(value)
            scheme, _, token = text.partition(" ")
            token = token.strip()
            if scheme.lower() != "bearer" or not token:
                break
            if len(token) > MAX_TOKEN_CHARS:
                raise _unauthenticated("token is too long")
            return token
    raise _unauthenticated(
        "missing 'authorization: Bearer <token>' metadata: data-plane calls through the "
        "gateway carry the sandbox's data-plane token, not the API key"
    )


def sandbox_and_tenant(token: str, signer: TokenSigner | None) -> tuple[str, str]:
    """The sandbox id and tenant a token is for; its signature checked when the key is known."""
    try:
        sandbox_id, tenant = unverified_claims(token)
        if signer is not None:
            claims = signer.verify(token, sandbox_id)
            return claims.sandbox_id, claims.tenant
        # No key here (a gateway apart from the node): route by the token's own
        # fields; the executor verifies the signature before serving anything.
        if not TENANT_RE.match(tenant):
            raise TokenError("malformed token")
        return sandbox_id, tenant
    except TokenError as exc:
        raise _unauthenticated(str(exc)) from None


class Routes:
    """Token -> Route, asking the scheduler once per token and TTL."""

    def __init__(
        self,
        scheduler: grpc.aio.Channel,
        signer: TokenSigner | None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._signer = signer
        self._clock = clock
        self._routes: dict[str, Route] = {}
        self._get = scheduler.unary_unary(
            "/orchard.v1.SandboxService/GetSandbox",
            request_serializer=sandbox_pb2.GetSandboxRequest.SerializeToString,
            response_deserializer=sandbox_pb2.Sandbox.FromString,
        )

    def forget(self, token: str) -> None:
        self._routes.pop(token, None)

    def cached(self, token: str) -> Route | None:
        """The remembered route, if still fresh (no await: the per-call path)."""
        route = self._routes.get(token)
        if route is not None and route.expires > self._clock():
            return route
        return None

    async def route(self, token: str) -> Route:
        return self.cached(token) or await self._lookup(token)

    async def _lookup(self, token: str) -> Route:
        sandbox_id, tenant = sandbox_and_tenant(token, self._signer)
        try:
            sandbox = await self._get(
                sandbox_pb2.GetSandboxRequest(id=sandbox_id),
                metadata=((TENANT_KEY, tenant),),
                timeout=10.0,
            )
        except grpc.aio.AioRpcError as exc:
            if exc.code() in (grpc.StatusCode.NOT_FOUND, grpc.StatusCode.UNAUTHENTICATED):
                raise ServiceError(
                    grpc.StatusCode.NOT_FOUND,
                    "SANDBOX_NOT_FOUND",
                    f"sandbox {sandbox_id[:80]!r} not found",
                ) from None
            raise ServiceError(
                grpc.StatusCode.UNAVAILABLE,
                "BACKEND_FAILURE",
                "the scheduler is unavailable",
                "infrastructure",
            ) from None
        address = sandbox.executor.address if sandbox.HasField("executor") else ""
        if address:  # a TLS executor is dialled as grpcs:// (Upstreams picks the credentials)
            address = scheme_address(address, sandbox.executor.tls)
        if not address:
            raise ServiceError(
                grpc.StatusCode.FAILED_PRECONDITION,
                "SANDBOX_NOT_READY",
                f"sandbox {sandbox_id} has no executor (state {sandbox_pb2.SandboxState.Name(sandbox.state)})",
            )
        if len(self._routes) >= MAX_ROUTES:
            self._routes.clear()
        route = self._routes[token] = Route(
            sandbox_id, tenant, address, self._clock() + ROUTE_TTL_SECONDS
        )
        return route


class Upstreams:
    """One grpc.aio channel per executor address, and its bytes multicallables.

    Bounded: an injected runtime gives every sandbox its own executor address,
    so past ``max_channels`` the oldest channel is retired (closed with a grace
    period for the calls still on it; the next call to that address opens a
    new one).
    """

    def __init__(
        self,
        max_channels: int = MAX_UPSTREAM_CHANNELS,
        credentials: grpc.ChannelCredentials | None = None,
    ) -> None:
        self.max_channels = max_channels
        self.credentials = credentials
        """For ``grpcs://`` executors (None: the system's roots, no client certificate)."""
        self._channels: dict[str, grpc.aio.Channel] = {}
        self._calls: dict[tuple[str, str], Any] = {}
        self._retiring: set[asyncio.Task[None]] = set()

    def _retire_oldest(self) -> None:
        address = next(iter(self._channels))
        channel = self._channels.pop(address)
        for key in [k for k in self._calls if k[0] == address]:
            del self._calls[key]
        task = asyncio.ensure_future(channel.close(RETIRE_GRACE_SECONDS))
        self._retiring.add(task)
        task.add_done_callback(self._retiring.discard)

    @property
    def open_channels(self) -> int:
        return len(self._channels)

    def call(self, address: str, full_method: str, kind: str) -> Any:
        key = (address, full_method)
        call = self._calls.get(key)
        if call is None:
            channel = self._channels.get(address)
            if channel is None:
                if len(self._channels) >= self.max_channels:
                    self._retire_oldest()
                channel = self._channels[address] = aio_channel(
                    address, self.credentials, options=UPSTREAM_OPTIONS
                )
            make = getattr(channel, kind)
            call = self._calls[key] = make(
                full_method, request_serializer=_identity, response_deserializer=_identity
            )
        return call

    async def close(self) -> None:
        channels = list(self._channels.values())
        self._channels.clear()
        self._calls.clear()
        for channel in channels:
            await channel.close(None)
        for task in list(self._retiring):
            task.cancel()


def forwarded_metadata(metadata: Any) -> tuple[tuple[str, Any], ...]:
    """The caller's metadata without per-hop transport headers (``grpc-*`` is gRPC's own:
    the deadline and encodings are set afresh on the upstream call)."""
    return tuple(
        (k, v)
        for k, v in (metadata or ())
        if k not in HOP_HEADERS and not k.startswith((":", "grpc-"))
    )


def _upstream_status(exc: grpc.aio.AioRpcError) -> PassedOnStatus | ServiceError:
    """The executor's status, message and Orchard trailers, unchanged (an executor that
    cannot be reached says so: EXECUTOR_UNAVAILABLE, fault infrastructure)."""
    passed = PassedOnStatus.of(exc)
    if passed.code == grpc.StatusCode.UNAVAILABLE and not passed.trailers:
        return ServiceError(
            passed.code, "EXECUTOR_UNAVAILABLE", passed.message, fault="infrastructure"
        )
    return passed


class DataPlaneProxy:
    """Forwards every ExecutorService call to the executor its token's sandbox lives on."""

    def __init__(
        self,
        scheduler: grpc.aio.Channel,
        signer: TokenSigner | None,
        upstream_credentials: grpc.ChannelCredentials | None = None,
    ) -> None:
        self.routes = Routes(scheduler, signer)
        self.upstreams = Upstreams(credentials=upstream_credentials)

    async def _target(self, context: Context, full_method: str, kind: str) -> tuple[Any, Any, str]:
        metadata = context.invocation_metadata()
        token = bearer_of(metadata)
        route = self.routes.cached(token) or await self.routes.route(token)
        return self.upstreams.call(route.address, full_method, kind), metadata, token

    def _on_upstream_error(self, token: str, exc: grpc.aio.AioRpcError) -> None:
        # A moved or vanished sandbox: ask the scheduler again next time.
        if exc.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.NOT_FOUND):
            self.routes.forget(token)

    def unary_unary(self, full_method: str) -> Callable[[bytes, Context], Any]:
        async def handle(request: bytes, context: Context) -> bytes:
            return await self._single(full_method, "unary_unary", request, context)

        return handle

    def unary_stream(self, full_method: str) -> Callable[[bytes, Context], AsyncIterator[bytes]]:
        async def handle(request: bytes, context: Context) -> AsyncIterator[bytes]:
            async for item in self._stream(full_method, "unary_stream", request, context):
                yield item

        return handle

    def stream_unary(self, full_method: str) -> Callable[[AsyncIterator[bytes], Context], Any]:
        async def handle(requests: AsyncIterator[bytes], context: Context) -> bytes:
            return await self._single(full_method, "stream_unary", requests, context)

        return handle

    @contextlib.asynccontextmanager
    async def _upstream(
        self, full_method: str, kind: str, request: Any, context: Context
    ) -> AsyncIterator[Any]:
        """The upstream call for ``request``; its errors raised to be relayed to the client
        by the service edge, and the call cancelled when the client goes away (or we fail)."""
        token = ""
        call = None
        try:
            multi, metadata, token = await self._target(context, full_method, kind)
            call = multi(
                request, metadata=forwarded_metadata(metadata), timeout=context.time_remaining()
            )
            yield call
        except grpc.aio.AioRpcError as exc:
            self._on_upstream_error(token, exc)
            raise _upstream_status(exc) from None
        finally:
            if call is not None and not call.done():
                call.cancel()

    async def _single(self, full_method: str, kind: str, request: Any, context: Context) -> bytes:
        """One response back: unary-unary and stream-unary calls."""
        async with self._upstream(full_method, kind, request, context) as call:
            response: bytes = await call
            return response

    def stream_stream(
        self, full_method: str
    ) -> Callable[[AsyncIterator[bytes], Context], AsyncIterator[bytes]]:
        async def handle(requests: AsyncIterator[bytes], context: Context) -> AsyncIterator[bytes]:
            async for item in self._stream(full_method, "stream_stream", requests, context):
                yield item

        return handle

    async def _stream(
        self, full_method: str, kind: str, request: Any, context: Context
    ) -> AsyncIterator[bytes]:
        async with self._upstream(full_method, kind, request, context) as call:
            async for item in call:
                yield item

    def handler(self) -> grpc.GenericRpcHandler:  # type: ignore[type-arg]
        """Bytes-in, bytes-out handlers for every ExecutorService method."""
        handlers: dict[str, grpc.RpcMethodHandler[Any, Any]] = {}
        for method in EXECUTOR_SERVICE.methods:
            full = f"/{EXECUTOR_SERVICE.full_name}/{method.name}"
            if method.client_streaming and method.server_streaming:
                handlers[method.name] = grpc.stream_stream_rpc_method_handler(
                    self.stream_stream(full)
                )
            elif method.client_streaming:
                handlers[method.name] = grpc.stream_unary_rpc_method_handler(
                    self.stream_unary(full)
                )
            elif method.server_streaming:
                handlers[method.name] = grpc.unary_stream_rpc_method_handler(
                    self.unary_stream(full)
                )
            else:
                handlers[method.name] = grpc.unary_unary_rpc_method_handler(self.unary_unary(full))
        return grpc.method_handlers_generic_handler(EXECUTOR_SERVICE.full_name, handlers)

    async def close(self) -> None:
        await self.upstreams.close()
