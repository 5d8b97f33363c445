"""The gateway's data-plane proxy against a real stack: every kind of call, refusals, cancellation.

Real ``orchard up`` (runc sandboxes), real gRPC through the gateway's port to
the node executor. Through the SDK (``ORCHARD_DATA_PLANE=proxy``) and through
raw stubs on the gateway channel, so the wire behaviour is checked too.
"""

from __future__ import annotations

import json
import secrets
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from orchard import Orchard, Sandbox
from orchard._proto.orchard.v1 import executor_pb2, executor_pb2_grpc, sandbox_pb2
from tests.gateway.conftest import GatewayStack
from tests.gateway.data_plane_checks import (
    bearer,
    check_exec_and_streaming_exec,
    check_files_and_tree,
    check_session,
    processes,
    run_request,
    wait_gone,
)
from tests.stack import REQUIRES_STACK

pytestmark = REQUIRES_STACK


def dev_key(gw: GatewayStack) -> str:
    return (gw.home / "dev-api-key").read_text().strip()


@pytest.fixture(scope="module")
def direct_sb(gw: GatewayStack) -> Iterator[Sandbox]:
    sb = Orchard(gw.endpoint, dev_key(gw)).sandboxes.create()
    try:
        yield sb
    finally:
        sb.delete()


@pytest.fixture
def proxied(gw: GatewayStack, direct_sb: Sandbox, monkeypatch: pytest.MonkeyPatch) -> Sandbox:
    monkeypatch.setenv("ORCHARD_DATA_PLANE", "proxy")
    return Orchard(gw.endpoint, dev_key(gw)).sandboxes.connect(direct_sb.id)


def access_of(gw: GatewayStack, sandbox_id: str, api_key: str) -> sandbox_pb2.ExecutorAccess:
    access: sandbox_pb2.ExecutorAccess = gw.control.GetExecutorAccess(
        sandbox_pb2.GetSandboxRequest(id=sandbox_id),
        metadata=(("authorization", f"Bearer {api_key}"),),
    )
    return access


def gateway_stub(gw: GatewayStack) -> executor_pb2_grpc.ExecutorServiceStub:
    return executor_pb2_grpc.ExecutorServiceStub(gw.channel)


def test_sdk_goes_to_the_gateway_in_proxy_mode(gw: GatewayStack, proxied: Sandbox) -> None:
    _stub, access = proxied._executor()
    assert proxied.config.data_plane == "proxy"
    assert proxied.client.data_plane_address(access) == gw.endpoint
    assert access.address != gw.endpoint  # the executor's own address is elsewhere


def test_exec_run_and_stream_through_proxy(proxied: Sandbox) -> None:
    check_exec_and_streaming_exec(proxied)


def test_session_through_proxy(proxied: Sandbox) -> None:
    check_session(proxied)


def test_files_through_proxy(proxied: Sandbox, tmp_path: Path) -> None:
    # 5 MB: several chunks each way
    check_files_and_tree(proxied, tmp_path, bytes(range(256)) * 20_000, files=50)


def test_raw_run_needs_the_sandbox_token(gw: GatewayStack, direct_sb: Sandbox) -> None:
    stub = gateway_stub(gw)
    access = access_of(gw, direct_sb.id, dev_key(gw))
    ok = stub.Run(run_request(direct_sb.id, "echo", "hi"), metadata=bearer(access.token))
    assert ok.stdout == b"hi\n"
    refusals = {
        "no metadata": (),
        "the API key": bearer(dev_key(gw)),
        "garbage": bearer("not.a.token"),
        "forged signature": bearer(
            access.token[:-4] + ("AAAA" if access.token[-4:] != "AAAA" else "BBBB")
        ),
    }
    for why, metadata in refusals.items():
        with pytest.raises(grpc.RpcError) as err:
            stub.Run(run_request(direct_sb.id, "true"), metadata=metadata)
        assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED, why
        assert err.value.details(), why


def test_foreign_tenant_token_refused(gw: GatewayStack, direct_sb: Sandbox) -> None:
    other_key = gw.new_tenant("proxyother")
    theirs = Orchard(gw.endpoint, other_key).sandboxes.create()
    try:
        stub = gateway_stub(gw)
        mine = access_of(gw, direct_sb.id, dev_key(gw)).token
        # The dev tenant's token, naming the other tenant's sandbox in the request.
        for call in (
            lambda: stub.Run(run_request(theirs.id, "true"), metadata=bearer(mine)),
            lambda: stub.ReadFile(
                executor_pb2.ReadFileRequest(sandbox_id=theirs.id, path="/etc/hostname"),
                metadata=bearer(mine),
            ).next(),
        ):
            with pytest.raises(grpc.RpcError) as err:
                call()
            assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
            assert "another sandbox" in (err.value.details() or "")
        # Their own token works for their sandbox through the same gateway.
        token = access_of(gw, theirs.id, other_key).token
        assert (
            stub.Run(run_request(theirs.id, "true"), metadata=bearer(token)).status.exit_code == 0
        )
    finally:
        theirs.delete()


def test_deadline_reaches_the_executor(gw: GatewayStack, direct_sb: Sandbox) -> None:
    stub = gateway_stub(gw)
    token = access_of(gw, direct_sb.id, dev_key(gw)).token
    started = time.monotonic()
    with pytest.raises(grpc.RpcError) as err:
        stub.Run(run_request(direct_sb.id, "sleep", "31.5"), metadata=bearer(token), timeout=0.5)
    assert err.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    assert time.monotonic() - started < 5
    assert wait_gone(direct_sb, "sleep 31.5", 10), processes(direct_sb)


def test_killed_stream_cancels_upstream(gw: GatewayStack, direct_sb: Sandbox) -> None:
    stub = gateway_stub(gw)
    token = access_of(gw, direct_sb.id, dev_key(gw)).token
    start = executor_pb2.ExecStart(
        sandbox_id=direct_sb.id, argv=["sh", "-c", "echo started; exec sleep 37.5"]
    )
    call = stub.Exec(iter([executor_pb2.ExecRequest(start=start)]), metadata=bearer(token))
    first = next(call)
    assert first.stdout == b"started\n"
    assert "sleep 37.5" in processes(direct_sb)
    call.cancel()
    assert wait_gone(direct_sb, "sleep 37.5", 10), processes(direct_sb)


def test_many_streams_at_once_through_proxy(proxied: Sandbox) -> None:
    """Concurrent calls on one gateway connection each reach their own command."""
    results: dict[int, bytes] = {}

    def one(i: int) -> None:
        results[i] = proxied.exec(["echo", str(i)]).stdout

    threads = [threading.Thread(target=one, args=(i,)) for i in range(32)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert results == {i: f"{i}\n".encode() for i in range(32)}


def test_metadata_reaches_the_executor(gw: GatewayStack, direct_sb: Sandbox) -> None:
    """The caller's trace context goes through the proxy: the executor's span joins the
    caller's trace as a direct child (the gateway adds no span for a pass-through)."""
    stub = gateway_stub(gw)
    token = access_of(gw, direct_sb.id, dev_key(gw)).token
    trace_id, parent_id = secrets.token_hex(16), secrets.token_hex(8)
    metadata = (*bearer(token), ("traceparent", f"00-{trace_id}-{parent_id}-01"))
    stub.Run(run_request(direct_sb.id, "true"), metadata=metadata)
    deadline = time.monotonic() + 10
    spans: list[dict[str, object]] = []
    while not spans and time.monotonic() < deadline:
        time.sleep(0.2)
        lines = (gw.home / "traces.jsonl").read_text().splitlines()
        spans = [s for s in map(json.loads, filter(str.strip, lines)) if s["trace_id"] == trace_id]
    assert [(s["service"], s["name"], s["parent_id"]) for s in spans] == [
        ("orchard-executor", "orchard.v1.ExecutorService/Run", parent_id)
    ]
