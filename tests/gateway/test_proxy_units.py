"""The data-plane proxy's parts: token parsing, routing cache, metadata, channel bound.

Routing is tested against a real grpc.aio server on a free loopback port that
answers GetSandbox like the scheduler does (a stand-in so each answer can be
chosen and counted; the whole path against the real scheduler is in
test_data_plane_proxy.py).
"""

from __future__ import annotations

import asyncio
from typing import Any

import grpc
import pytest
from orchard.gateway.proxy import (
    Routes,
    Upstreams,
    bearer_of,
    forwarded_metadata,
    sandbox_and_tenant,
)

from orchard._proto.orchard.v1 import sandbox_pb2
from orchard.common.errors import ServiceError
from orchard.common.tokens import TokenSigner

SIGNER = TokenSigner.from_key(b"k" * 32)


def token(sandbox_id: str = "sb-abc", tenant: str = "dev", signer: TokenSigner = SIGNER) -> str:
    return signer.issue(sandbox_id, 3600, tenant=tenant)[0]


def test_bearer_of() -> None:
    assert bearer_of((("x", "y"), ("authorization", "Bearer  tok "))) == "tok"
    for bad in ((), (("authorization", "Basic tok"),), (("authorization", "Bearer "),)):
        with pytest.raises(ServiceError) as err:
            bearer_of(bad)
        assert err.value.code == grpc.StatusCode.UNAUTHENTICATED
    with pytest.raises(ServiceError, match="too long"):
        bearer_of((("authorization", "Bearer " + "t" * 2000),))


def test_sandbox_and_tenant_verifies_when_it_has_the_key() -> None:
    assert sandbox_and_tenant(token("sb-1", "team.a"), SIGNER) == ("sb-1", "team.a")
    forged = token("sb-1", "dev", TokenSigner.from_key(b"z" * 32))
    with pytest.raises(ServiceError, match="signature"):
        sandbox_and_tenant(forged, SIGNER)
    # Without the key it routes by the token's fields; the executor verifies.
    assert sandbox_and_tenant(forged, None) == ("sb-1", "dev")
    for garbage in (
        "a.b.c",
        "v3.k0.sb.%%%.0.1.2.sig",
        "v3.k0.sb.LS0tLQ.0.1.2.sig",
        "v2.sb.ZA.0.1.s",
    ):
        with pytest.raises(ServiceError):
            sandbox_and_tenant(garbage, None)


def test_forwarded_metadata_drops_hop_headers() -> None:
    given = (
        ("authorization", "Bearer t"),
        ("user-agent", "grpc-python"),
        ("x-request-id", "r1"),
        (":authority", "gw"),
        ("grpc-accept-encoding", "gzip"),
        ("traceparent", "00-abc"),
    )
    assert forwarded_metadata(given) == (
        ("authorization", "Bearer t"),
        ("x-request-id", "r1"),
        ("traceparent", "00-abc"),
    )


class FakeScheduler:
    """GetSandbox answers chosen by the test, counted."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str]] = []
        self.answers: dict[str, Any] = {}

    async def get(
        self, request: sandbox_pb2.GetSandboxRequest, context: Any
    ) -> sandbox_pb2.Sandbox:
        tenant = dict(context.invocation_metadata()).get("orchard-tenant", "")
        self.calls.append((request.id, tenant))
        answer = self.answers.get(request.id)
        if answer is None:
            await context.abort(grpc.StatusCode.NOT_FOUND, "no such sandbox")
        assert isinstance(answer, sandbox_pb2.Sandbox)
        return answer


async def with_scheduler(fake: FakeScheduler, body: Any) -> None:
    server = grpc.aio.server()
    handler = grpc.unary_unary_rpc_method_handler(
        fake.get,
        request_deserializer=sandbox_pb2.GetSandboxRequest.FromString,
        response_serializer=sandbox_pb2.Sandbox.SerializeToString,
    )
    server.add_generic_rpc_handlers(
        (
            grpc.method_handlers_generic_handler(
                "orchard.v1.SandboxService", {"GetSandbox": handler}
            ),
        )
    )
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
    try:
        await body(channel)
    finally:
        await channel.close()
        await server.stop(None)


def ready(sandbox_id: str, address: str) -> sandbox_pb2.Sandbox:
    return sandbox_pb2.Sandbox(
        id=sandbox_id,
        state=sandbox_pb2.READY,
        executor=sandbox_pb2.ExecutorAccess(address=address),
    )


def test_routes_ask_once_per_token_and_ttl() -> None:
    fake = FakeScheduler()
    fake.answers["sb-abc"] = ready("sb-abc", "127.0.0.1:7070")
    now = [1000.0]

    async def body(channel: grpc.aio.Channel) -> None:
        routes = Routes(channel, SIGNER, clock=lambda: now[0])
        tok = token()
        first = await routes.route(tok)
        again = await routes.route(tok)
        assert first.address == again.address == "127.0.0.1:7070"
        assert fake.calls == [("sb-abc", "dev")]  # asked as the token's tenant, once
        now[0] += 31  # past the TTL
        fake.answers["sb-abc"] = ready("sb-abc", "127.0.0.1:7071")
        assert (await routes.route(tok)).address == "127.0.0.1:7071"
        routes.forget(tok)
        await routes.route(tok)
        assert len(fake.calls) == 3

    asyncio.run(with_scheduler(fake, body))


def test_routes_refusals() -> None:
    fake = FakeScheduler()
    fake.answers["sb-new"] = sandbox_pb2.Sandbox(id="sb-new", state=sandbox_pb2.PENDING)

    async def body(channel: grpc.aio.Channel) -> None:
        routes = Routes(channel, SIGNER)
        with pytest.raises(ServiceError) as err:
            await routes.route(token("sb-gone"))
        assert err.value.code == grpc.StatusCode.NOT_FOUND
        with pytest.raises(ServiceError) as err:
            await routes.route(token("sb-new"))
        assert err.value.code == grpc.StatusCode.FAILED_PRECONDITION
        with pytest.raises(ServiceError) as err:
            await routes.route(token("sb-abc", signer=TokenSigner.from_key(b"q" * 32)))
        assert err.value.code == grpc.StatusCode.UNAUTHENTICATED
        assert [c[0] for c in fake.calls] == ["sb-gone", "sb-new"]  # forged: never asked

    asyncio.run(with_scheduler(fake, body))


def test_upstream_channels_are_bounded() -> None:
    async def body() -> None:
        upstreams = Upstreams(max_channels=2)
        method = "/orchard.v1.ExecutorService/Run"
        first = upstreams.call("127.0.0.1:1", method, "unary_unary")
        assert upstreams.call("127.0.0.1:1", method, "unary_unary") is first
        upstreams.call("127.0.0.1:2", method, "unary_unary")
        upstreams.call("unix:/tmp/orchard-no-such.sock", method, "unary_unary")
        assert upstreams.open_channels == 2
        assert upstreams.call("127.0.0.1:1", method, "unary_unary") is not first
        assert upstreams.open_channels == 2
        await upstreams.close()
        assert upstreams.open_channels == 0

    asyncio.run(body())
