"""The fake control plane validates and answers like the gateway and scheduler."""

from __future__ import annotations

import asyncio
from typing import Any

import grpc
import pytest

from orchard import (
    AuthenticationError,
    ImageNotFoundError,
    InvalidRequestError,
    NetworkPolicy,
    Orchard,
    SandboxNotFoundError,
    SandboxNotReadyError,
)
from orchard._proto.orchard.v1 import common_pb2, sandbox_pb2, sandbox_pb2_grpc
from orchard.client._errors import FAULT_KEY, REASON_KEY
from orchard.common import errors as server_errors
from orchard.testing import FakeOrchard


def _stub(fake: FakeOrchard) -> sandbox_pb2_grpc.SandboxServiceStub:
    return sandbox_pb2_grpc.SandboxServiceStub(fake.transport().channel(fake.endpoint))


def _refusal(call: Any, *args: Any, **kw: Any) -> tuple[grpc.StatusCode, str, str]:
    with pytest.raises(grpc.RpcError) as info:
        call(*args, **kw)
    err: Any = info.value
    trailers = dict(err.trailing_metadata())
    return err.code(), trailers.get(REASON_KEY, ""), err.details()


def test_trailer_keys_are_the_servers() -> None:
    assert (REASON_KEY, FAULT_KEY) == (server_errors.REASON_KEY, server_errors.FAULT_KEY)


@pytest.mark.parametrize(
    ("request_fields", "code", "reason", "field"),
    [
        ({"image": "Bad Image!"}, grpc.StatusCode.INVALID_ARGUMENT, "INVALID_FIELD", "image"),
        ({"image": "unknown"}, grpc.StatusCode.NOT_FOUND, "IMAGE_NOT_FOUND", "unknown"),
        (
            {"resources": common_pb2.Resources(cpu_millis=10)},
            grpc.StatusCode.INVALID_ARGUMENT,
            "INVALID_FIELD",
            "cpu_millis",
        ),
        (
            {"resources": common_pb2.Resources(memory_bytes=1)},
            grpc.StatusCode.INVALID_ARGUMENT,
            "INVALID_FIELD",
            "memory_bytes",
        ),
        ({"ttl_seconds": 10**9}, grpc.StatusCode.INVALID_ARGUMENT, "INVALID_FIELD", "ttl_seconds"),
        (
            {"labels": {"bad key!": "v"}},
            grpc.StatusCode.INVALID_ARGUMENT,
            "INVALID_FIELD",
            "labels",
        ),
        ({"env": {"1BAD": "v"}}, grpc.StatusCode.INVALID_ARGUMENT, "INVALID_FIELD", "env"),
        (
            {"request_id": "has space"},
            grpc.StatusCode.INVALID_ARGUMENT,
            "INVALID_FIELD",
            "request_id",
        ),
        (
            {"template": "py-small", "image": "debian"},
            grpc.StatusCode.INVALID_ARGUMENT,
            "INVALID_FIELD",
            "image",
        ),
        ({"template": "nope"}, grpc.StatusCode.NOT_FOUND, "INVALID_FIELD", "template"),
        (
            {
                "network": common_pb2.NetworkPolicy(
                    mode=common_pb2.NetworkPolicy.NONE, cidrs=["10.0.0.0/8"]
                )
            },
            grpc.StatusCode.INVALID_ARGUMENT,
            "INVALID_FIELD",
            "network",
        ),
    ],
)
def test_create_refusals_name_the_field(
    fake: FakeOrchard,
    request_fields: dict[str, Any],
    code: grpc.StatusCode,
    reason: str,
    field: str,
) -> None:
    got = _refusal(
        _stub(fake).CreateSandbox,
        sandbox_pb2.CreateSandboxRequest(**request_fields),
        metadata=(("authorization", f"Bearer {fake.api_key}"),),
    )
    assert got[:2] == (code, reason) and field in got[2]
    assert fake.world.sandboxes == {}


@pytest.mark.parametrize(
    ("metadata", "message"),
    [
        ((), "missing API key"),
        ((("authorization", "Basic abc"),), "malformed"),
        ((("authorization", "Bearer wrong"),), "invalid API key"),
    ],
)
def test_api_keys_are_checked(fake: FakeOrchard, metadata: Any, message: str) -> None:
    code, reason, details = _refusal(
        _stub(fake).ListSandboxes, sandbox_pb2.ListSandboxesRequest(), metadata=metadata
    )
    assert (code, reason) == (grpc.StatusCode.UNAUTHENTICATED, "API_KEY_INVALID")
    assert message in details


def test_tenants_see_only_their_own_sandboxes() -> None:
    with FakeOrchard(tenants={"a": ["key-a"], "b": ["key-b"]}) as fake:
        with fake.client(api_key="key-a") as a, fake.client(api_key="key-b") as b:
            mine = a.sandboxes.create()
            assert [s.tenant for s in a.sandboxes.list()] == ["a"]
            assert b.sandboxes.list() == []
            with pytest.raises(SandboxNotFoundError):
                b.sandboxes.connect(mine.id)
            with pytest.raises(SandboxNotFoundError):
                b.sandboxes.delete(mine.id)
        with pytest.raises(AuthenticationError), fake.client(api_key="key-c") as c:
            c.sandboxes.create()


def test_request_id_makes_create_idempotent(fake: FakeOrchard, client: Orchard) -> None:
    first = client.sandboxes.create(request_id="job-1", labels={"try": "1"})
    again = client.sandboxes.create(request_id="job-1", labels={"try": "2"})
    assert again.id == first.id and again.last_info.labels == {"try": "1"}
    assert len(client.sandboxes.list()) == 1
    first.delete()
    with pytest.raises(SandboxNotReadyError):  # the scheduler answers the deleted one: not ready
        client.sandboxes.create(request_id="job-1")


def test_lifecycle_keepalive_network_and_access(fake: FakeOrchard, client: Orchard) -> None:
    with pytest.raises(ImageNotFoundError):
        client.sandboxes.create(image="missing")
    sb = client.sandboxes.create(ttl=60, labels={"k": "v"})
    info = sb.info()
    assert (info.state, info.labels, info.image) == ("ready", {"k": "v"}, "debian")
    before = info.expires_at
    assert sb.keepalive(600).expires_at > before
    with pytest.raises(InvalidRequestError):
        sb.keepalive(10**9)
    updated = sb.set_network("allowlist", cidrs=["203.0.113.0/24"], ports=[443])
    assert updated.network == NetworkPolicy("allowlist", ("203.0.113.0/24",), (443,), ())
    assert list(fake.network_policy(sb.id).cidrs) == ["203.0.113.0/24"]
    token_call = _stub(fake).GetExecutorAccess(
        sandbox_pb2.GetSandboxRequest(id=sb.id),
        metadata=(("authorization", f"Bearer {fake.api_key}"),),
    )
    assert token_call.address == fake.executor_endpoint and token_call.token
    sb.delete()
    assert client.sandboxes.connect(sb.id).last_info.state == "deleted"
    assert not fake.root(sb.id).exists()
    client.sandboxes.delete(sb.id)  # deleting again is fine
    code, reason, _ = _refusal(
        _stub(fake).GetExecutorAccess,
        sandbox_pb2.GetSandboxRequest(id=sb.id),
        metadata=(("authorization", f"Bearer {fake.api_key}"),),
    )
    assert (code, reason) == (grpc.StatusCode.FAILED_PRECONDITION, "SANDBOX_NOT_READY")


def test_proxied_data_plane_goes_through_the_gateway_address(fake: FakeOrchard) -> None:
    proxied = Orchard(fake.endpoint, fake.api_key, data_plane="proxy", transport=fake.transport())
    with proxied as c, c.sandboxes.create() as sb:
        assert sb.exec("echo via-gateway").stdout == b"via-gateway\n"


def test_tenant_view_reports_usage_and_no_quota(fake: FakeOrchard, client: Orchard) -> None:
    client.sandboxes.create(cpu=0.5, memory="256Mi")
    client.sandboxes.create()
    view = client.tenant()
    assert (view.tenant, view.sandboxes, view.cpu) == ("dev", 2, 1.5)
    assert view.memory_bytes == (256 << 20) + (1 << 30)
    assert set(view.quota.values()) == {0}  # the fake enforces no quota
    assert view.server_version.endswith("+fake")

    async def main() -> int:
        async with fake.async_client() as aclient:
            return (await aclient.tenant()).sandboxes

    assert asyncio.run(main()) == 2


def test_the_model_endpoint_is_recorded_and_reaches_what_the_test_maps(
    fake: FakeOrchard, client: Orchard
) -> None:
    with client.sandboxes.create(model_endpoint=True) as sb:
        assert sb.info().model_endpoint == "http://127.0.0.1:7711"  # the real node's URL
        assert sb.exec("echo $ORCHARD_MODEL_BASE").stdout_text.strip() == "http://127.0.0.1:7711"
    fake.map_model_endpoint("http://127.0.0.1:50090/")
    with client.sandboxes.create(model_endpoint=True) as sb:
        assert sb.info().model_endpoint == "http://127.0.0.1:50090"
        assert sb.exec("echo $ORCHARD_MODEL_BASE").stdout_text.strip() == "http://127.0.0.1:50090"
    with client.sandboxes.create() as sb:
        assert sb.info().model_endpoint == ""
        assert sb.exec("echo ${ORCHARD_MODEL_BASE-unset}").stdout_text.strip() == "unset"
    with pytest.raises(InvalidRequestError, match="model_endpoint: not available with a template"):
        client.sandboxes.create(template="py-small", model_endpoint=True)
