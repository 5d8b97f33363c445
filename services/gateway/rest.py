"""The REST/JSON front of the public API, derived from the proto descriptors.

Every unary and server-streaming method of ``orchard.v1.SandboxService`` and
``orchard.v1.ExecutorService`` is served as ``POST /v1/<Service>/<Method>``
(e.g. ``POST /v1/SandboxService/CreateSandbox``). The routes, the request
parsing and the answers all come from the descriptors and protobuf's JSON
mapping (``json_format``), so nothing is written twice and a new RPC appears
here by itself. Client-streaming calls (Exec with stdin, WriteFile, Upload)
have no JSON form; ``Run`` covers a command with known stdin.

- **Auth** is the gRPC API's: ``Authorization: Bearer <API key>``. A
  SandboxService call goes to the gateway's own gRPC port (same auth, same
  quotas, same errors, by construction). An ExecutorService call is
  authorised by the same key: the front asks the gateway for the sandbox's
  executor access (``GetExecutorAccess``: the tenant must own the sandbox),
  caches it until shortly before the token expires (checking the key again on
  every call, so a revoked key stops at once), and calls the executor with that
  token; the executor checks it as for any client.
- **Bodies**: the request message in proto3 JSON (field names in
  ``snake_case`` or ``lowerCamelCase``; ``bytes`` as base64; an empty body is
  the empty message); unknown fields are refused (400). Answers use the proto
  field names. A server-streaming answer is NDJSON: one message per line; an
  error after the first line arrives as a last line ``{"error": {...}}``.
- **Errors**: the gRPC status maps to the HTTP status the Google API
  guidelines use (NOT_FOUND 404, RESOURCE_EXHAUSTED 429, UNAVAILABLE 503, ...)
  with a body ``{"error": {"code", "http_status", "reason", "fault",
  "message"}}``; RESOURCE_EXHAUSTED adds ``retry_after`` and a ``Retry-After``
  header.
- ``x-request-id`` and ``traceparent`` headers are passed on as gRPC metadata.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import ssl
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import grpc
import structlog
from aiohttp import web
from google.protobuf import json_format, message_factory
from google.protobuf.descriptor import MethodDescriptor, ServiceDescriptor
from google.protobuf.message import Message

from orchard._proto.orchard.v1 import executor_pb2, sandbox_pb2
from orchard.common.errors import FAULT_KEY, REASON_KEY, RETRY_AFTER_KEY, ServiceError
from orchard.common.observability import REQUEST_ID_KEY, OutgoingContextInterceptor
from orchard.common.service_edge import PassedOnStatus
from orchard.common.tls import aio_channel, scheme_address

log = structlog.get_logger("orchard.gateway")

SERVICES: tuple[ServiceDescriptor, ...] = (
    sandbox_pb2.DESCRIPTOR.services_by_name["SandboxService"],
    executor_pb2.DESCRIPTOR.services_by_name["ExecutorService"],
)
PASSED_HEADERS = (REQUEST_ID_KEY, "traceparent", "tracestate")
MAX_BODY_BYTES = 64 << 20
# A request body must arrive within this many seconds (a slow-body client holds a
# connection and a buffer until then): answered 408. $ORCHARD_REST_BODY_SECONDS.
BODY_READ_SECONDS = 30.0
DEFAULT_DEADLINE_SECONDS = 600.0
# Fetch a new executor token this long before the cached one expires.
ACCESS_MARGIN_SECONDS = 60.0

HTTP_STATUS = {
    grpc.StatusCode.OK: 200,
    grpc.StatusCode.CANCELLED: 499,
    grpc.StatusCode.UNKNOWN: 500,
    grpc.StatusCode.INVALID_ARGUMENT: 400,
    grpc.StatusCode.DEADLINE_EXCEEDED: 504,
    grpc.StatusCode.NOT_FOUND: 404,
    grpc.StatusCode.ALREADY_EXISTS: 409,
    grpc.StatusCode.PERMISSION_DENIED: 403,
    grpc.StatusCode.UNAUTHENTICATED: 401,
    grpc.StatusCode.RESOURCE_EXHAUSTED: 429,
    grpc.StatusCode.FAILED_PRECONDITION: 400,
    grpc.StatusCode.ABORTED: 409,
    grpc.StatusCode.OUT_OF_RANGE: 400,
    grpc.StatusCode.UNIMPLEMENTED: 501,
    grpc.StatusCode.INTERNAL: 500,
    grpc.StatusCode.UNAVAILABLE: 503,
    grpc.StatusCode.DATA_LOSS: 500,
}


@dataclass(frozen=True)
class RestError(Exception):
    """A gRPC-shaped failure to answer as JSON."""

    code: grpc.StatusCode
    message: str
    reason: str = ""
    fault: str = "client"
    retry_after: float | None = None
    http_status: int | None = None
    """Set where HTTP has a better status than the code's mapping (408 for a slow body)."""

    @classmethod
    def from_rpc(cls, exc: grpc.aio.AioRpcError) -> RestError:
        """A service's status as JSON: its Orchard trailers read the one way every
        service passes them on (``service_edge.PassedOnStatus``)."""
        passed = PassedOnStatus.of(exc, exc.code().name.lower())
        trailers = dict(passed.trailers)
        retry: float | None = None
        try:
            retry = float(trailers[RETRY_AFTER_KEY]) if RETRY_AFTER_KEY in trailers else None
        except ValueError:
            retry = None
        infra = passed.code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.INTERNAL)
        return cls(
            passed.code,
            passed.message,
            trailers.get(REASON_KEY, ""),
            trailers.get(FAULT_KEY, "infrastructure" if infra else "client"),
            retry,
        )

    def body(self) -> dict[str, Any]:
        error: dict[str, Any] = {
            "code": self.code.name,
            "http_status": self.http_status or HTTP_STATUS.get(self.code, 500),
            "reason": self.reason,
            "fault": self.fault,
            "message": self.message,
        }
        if self.retry_after is not None:
            error["retry_after"] = self.retry_after
        return {"error": error}

    def response(self) -> web.Response:
        headers = {}
        if self.retry_after is not None:
            headers["Retry-After"] = str(max(1, math.ceil(self.retry_after)))
        return web.json_response(
            self.body(), status=self.http_status or HTTP_STATUS.get(self.code, 500), headers=headers
        )


def _bad_request(message: str) -> RestError:
    return RestError(grpc.StatusCode.INVALID_ARGUMENT, message, "INVALID_FIELD")


def to_json(message: Message) -> dict[str, Any]:
    out: dict[str, Any] = json_format.MessageToDict(message, preserving_proto_field_name=True)
    return out


def parse_body(body: bytes, cls: type[Message]) -> Message:
    """A request body (JSON, or empty for the default message) as ``cls``; RestError
    (INVALID_ARGUMENT) for anything else. Pure, so the fuzzer can drive it."""
    message = cls()
    if body.strip():
        try:
            json_format.Parse(body, message)
        except (json_format.ParseError, UnicodeDecodeError) as exc:
            raise _bad_request(f"invalid {cls.DESCRIPTOR.full_name} JSON: {exc}") from None
    return message


def sandbox_id_in(message: Message) -> str:
    """The sandbox an ExecutorService request names (top level or in ``start``)."""
    if "sandbox_id" in message.DESCRIPTOR.fields_by_name:
        return str(getattr(message, "sandbox_id"))  # noqa: B009
    for field in message.DESCRIPTOR.fields:
        if field.message_type is not None and "sandbox_id" in field.message_type.fields_by_name:
            return str(getattr(getattr(message, field.name), "sandbox_id"))  # noqa: B009
    return ""


@dataclass
class _Access:
    address: str
    token: str
    expires_at: float


class RestFront:
    """aiohttp handlers that turn JSON calls into gRPC calls (one route per RPC)."""

    def __init__(
        self,
        gateway_address: str,
        authenticate: Callable[[str], str] | None = None,
        executor_credentials: grpc.ChannelCredentials | None = None,
    ) -> None:
        self._authenticate = authenticate
        self._gateway = aio_channel(gateway_address, interceptors=[OutgoingContextInterceptor()])
        self._executor_credentials = executor_credentials
        self._executors: dict[str, grpc.aio.Channel] = {}
        self._access: dict[tuple[str, str], _Access] = {}
        self._body_seconds = float(os.environ.get("ORCHARD_REST_BODY_SECONDS") or BODY_READ_SECONDS)

    async def close(self) -> None:
        await self._gateway.close(None)
        for channel in self._executors.values():
            await channel.close(None)

    def routes(self) -> list[web.RouteDef]:
        routes = []
        for service in SERVICES:
            for method in service.methods:
                if method.client_streaming:
                    continue
                routes.append(
                    web.post(f"/v1/{service.name}/{method.name}", self._handler(service, method))
                )
        return routes

    # ---- plumbing -----------------------------------------------------------------

    def _executor_channel(self, address: str) -> grpc.aio.Channel:
        channel = self._executors.get(address)
        if channel is None:
            channel = self._executors[address] = aio_channel(
                address,
                self._executor_credentials,
                options=[("grpc.max_receive_message_length", MAX_BODY_BYTES)],
                interceptors=[OutgoingContextInterceptor()],
            )
        return channel

    async def _executor_access(
        self, metadata: tuple[tuple[str, str], ...], authorization: str, sandbox_id: str
    ) -> _Access:
        """Address and token for ``sandbox_id``, asked of the gateway with the caller's key."""
        # The key is part of the cache key: another tenant's key never reuses this entry.
        cache_key = (authorization, sandbox_id)
        cached = self._access.get(cache_key)
        if cached is not None and cached.expires_at - ACCESS_MARGIN_SECONDS > time.time():
            # The key is checked again on every call: a revoked or rotated key must not
            # keep using what it fetched before (the gRPC API checks it per call too).
            self._check_key(authorization, cache_key)
            return cached
        call = self._gateway.unary_unary(
            "/orchard.v1.SandboxService/GetExecutorAccess",
            request_serializer=lambda m: m.SerializeToString(),
            response_deserializer=sandbox_pb2.ExecutorAccess.FromString,
        )
        access_msg: sandbox_pb2.ExecutorAccess = await call(
            sandbox_pb2.GetSandboxRequest(id=sandbox_id), metadata=metadata, timeout=30
        )
        access = _Access(
            scheme_address(access_msg.address, access_msg.tls),
            access_msg.token,
            access_msg.token_expires_at.seconds + access_msg.token_expires_at.nanos / 1e9,
        )
        if len(self._access) > 10_000:
            self._access.clear()
        self._access[cache_key] = access
        return access

    def _check_key(self, authorization: str, cache_key: tuple[str, str]) -> None:
        if self._authenticate is None:
            return
        try:
            self._authenticate(authorization)
        except ServiceError as exc:
            self._access.pop(cache_key, None)
            raise RestError(exc.code, exc.message, exc.reason, exc.fault) from None

    async def _parse(self, request: web.Request, cls: type[Message]) -> Message:
        if request.content_length is not None and request.content_length > MAX_BODY_BYTES:
            raise _bad_request(f"body larger than {MAX_BODY_BYTES} bytes")
        try:
            async with asyncio.timeout(self._body_seconds):
                body = await request.read()
        except TimeoutError:
            raise RestError(
                grpc.StatusCode.DEADLINE_EXCEEDED,
                f"the request body did not arrive within {self._body_seconds:g} s",
                "BODY_TIMEOUT",
                http_status=408,
            ) from None
        return parse_body(body, cls)

    async def _target(
        self, service: ServiceDescriptor, request: web.Request, message: Message
    ) -> tuple[grpc.aio.Channel, tuple[tuple[str, str], ...]]:
        """The channel to call and the metadata to send."""
        authorization = request.headers.get("Authorization", "")
        passed = tuple((h, request.headers[h]) for h in PASSED_HEADERS if h in request.headers)
        metadata = (("authorization", authorization), *passed) if authorization else passed
        if service.name == "SandboxService":
            return self._gateway, metadata
        sandbox_id = sandbox_id_in(message)
        if not sandbox_id:
            raise _bad_request("sandbox_id: a sandbox id is required")
        access = await self._executor_access(metadata, authorization, sandbox_id)
        return self._executor_channel(access.address), (
            ("authorization", f"Bearer {access.token}"),
            *passed,
        )

    def _handler(
        self, service: ServiceDescriptor, method: MethodDescriptor
    ) -> Callable[[web.Request], Any]:
        full_method = f"/{service.full_name}/{method.name}"
        request_cls = message_factory.GetMessageClass(method.input_type)
        response_cls = message_factory.GetMessageClass(method.output_type)
        streaming = method.server_streaming

        async def handle(request: web.Request) -> web.StreamResponse:
            try:
                message = await self._parse(request, request_cls)
                channel, metadata = await self._target(service, request, message)
                if streaming:
                    call = channel.unary_stream(
                        full_method,
                        request_serializer=lambda m: m.SerializeToString(),
                        response_deserializer=response_cls.FromString,
                    )
                    stream = call(message, metadata=metadata, timeout=DEFAULT_DEADLINE_SECONDS)
                    return await _ndjson(request, stream)
                unary = channel.unary_unary(
                    full_method,
                    request_serializer=lambda m: m.SerializeToString(),
                    response_deserializer=response_cls.FromString,
                )
                answer = await unary(message, metadata=metadata, timeout=DEFAULT_DEADLINE_SECONDS)
                return web.json_response(to_json(answer))
            except RestError as exc:
                return exc.response()
            except grpc.aio.AioRpcError as exc:
                return RestError.from_rpc(exc).response()

        return handle


async def _ndjson(request: web.Request, stream: Any) -> web.StreamResponse:
    """Stream messages as JSON lines; an error before the first line is a normal JSON error."""
    iterator: AsyncIterator[Message] = stream.__aiter__()
    try:
        first = await anext(iterator, None)
    except grpc.aio.AioRpcError as exc:
        return RestError.from_rpc(exc).response()
    response = web.StreamResponse(headers={"Content-Type": "application/x-ndjson"})
    await response.prepare(request)
    try:
        if first is not None:
            await response.write(_line(to_json(first)))
            async for message in iterator:
                await response.write(_line(to_json(message)))
    except grpc.aio.AioRpcError as exc:
        await response.write(_line(RestError.from_rpc(exc).body()))
    await response.write_eof()
    return response


def _line(data: dict[str, Any]) -> bytes:
    return json.dumps(data, separators=(",", ":")).encode() + b"\n"


async def _not_found(request: web.Request) -> web.Response:
    return RestError(
        grpc.StatusCode.NOT_FOUND,
        f"no route {request.method} {request.path}: use POST /v1/<Service>/<Method>",
        "INVALID_FIELD",
    ).response()


@web.middleware
async def _json_errors(request: web.Request, handler: Callable[..., Any]) -> web.StreamResponse:
    try:
        response: web.StreamResponse = await handler(request)
        return response
    except web.HTTPMethodNotAllowed:
        return RestError(
            grpc.StatusCode.UNIMPLEMENTED, f"{request.method} is not allowed here: use POST"
        ).response()
    except web.HTTPNotFound:
        return await _not_found(request)


def build_app(front: RestFront) -> web.Application:
    app = web.Application(client_max_size=MAX_BODY_BYTES, middlewares=[_json_errors])
    app.add_routes(front.routes())
    return app


@dataclass
class RunningRest:
    address: str
    runner: web.AppRunner
    front: RestFront

    async def stop(self) -> None:
        await self.runner.cleanup()
        await self.front.close()


async def start_rest(
    listen: str,
    gateway_address: str,
    authenticate: Callable[[str], str] | None = None,
    ssl_context: ssl.SSLContext | None = None,
    executor_credentials: grpc.ChannelCredentials | None = None,
) -> RunningRest:
    """Serve the REST front on ``listen`` ("host:port", port 0 = free): HTTPS with
    ``ssl_context``, else plain HTTP. ``gateway_address`` is where its SandboxService calls
    go (the gateway's own gRPC service; ``grpcs://`` for a TLS one); ``authenticate`` (the
    gateway's API-key check) re-checks a key before cached executor access is used;
    ``executor_credentials`` is what it dials ``grpcs://`` executors with. ``address`` is
    ``https://host:port`` when it serves TLS, bare ``host:port`` otherwise."""
    front = RestFront(gateway_address, authenticate, executor_credentials)
    runner = web.AppRunner(build_app(front), access_log=None)
    await runner.setup()
    host, _, port = listen.rpartition(":")
    site = web.TCPSite(runner, host or "127.0.0.1", int(port or 0), ssl_context=ssl_context)
    await site.start()
    bound = int(runner.addresses[0][1])
    address = f"{'https://' if ssl_context else ''}{host or '127.0.0.1'}:{bound}"
    log.info("REST front serving", address=address)
    return RunningRest(address, runner, front)


__all__ = ["RestError", "RestFront", "RunningRest", "start_rest", "to_json"]
