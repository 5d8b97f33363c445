"""The one service edge and runner, on a tiny real grpc.aio server on a free loopback port.

Its handlers raise what servicers raise (ServiceError, a bug, a passed-on
status) in every handler shape grpc.aio accepts (async and sync, unary, async
and sync response streams, the reader/writer API, request streams); a real
grpc.aio client checks what leaves the process: code, message and the
``orchard-reason`` / ``orchard-fault`` / ``retry-after`` trailers. The health
service and the address file are checked through the same runner.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from orchard.common.address_file import public_address
from orchard.common.errors import ServiceError, invalid, quota_exceeded
from orchard.common.service_edge import PassedOnStatus
from orchard.common.service_runner import ServiceRunner

SERVICE = "test.Edge"
SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


class Disk(Exception):
    """A failure the service recognises itself (what the scheduler's full disk is)."""


def translate(exc: Exception) -> ServiceError | None:
    if isinstance(exc, Disk):
        return ServiceError(
            grpc.StatusCode.RESOURCE_EXHAUSTED, "DISK_FULL", "disk", "infrastructure"
        )
    return None


async def unary_quota(request: bytes, context: Any) -> bytes:
    raise quota_exceeded("over the create rate", retry_after=1.5)


async def unary_bug(request: bytes, context: Any) -> bytes:
    raise ValueError("secret internals 0xdeadbeef")


async def unary_disk(request: bytes, context: Any) -> bytes:
    raise Disk("ENOSPC")


async def unary_passed(request: bytes, context: Any) -> bytes:
    raise PassedOnStatus(
        grpc.StatusCode.NOT_FOUND,
        "sandbox sb-1 not found",
        (("orchard-reason", "SANDBOX_NOT_FOUND"), ("orchard-fault", "client")),
    )


async def unary_ok(request: bytes, context: Any) -> bytes:
    return b"ok:" + request


def sync_unary(request: bytes, context: Any) -> bytes:
    raise invalid("sync: bad field")


async def async_stream(request: bytes, context: Any) -> AsyncIterator[bytes]:
    yield b"first"
    await asyncio.sleep(0)
    raise invalid("stream: bad after one")


async def async_stream_bug(request: bytes, context: Any) -> AsyncIterator[bytes]:
    yield b"first"
    raise RuntimeError("stream bug")


def sync_stream(request: bytes, context: Any) -> Iterator[bytes]:
    yield b"first"
    yield b"second"
    raise invalid("sync stream: bad after two")


async def writer_stream(request: bytes, context: Any) -> None:
    await context.write(b"written")
    raise invalid("writer: bad after one")


async def request_stream(requests: AsyncIterator[bytes], context: Any) -> bytes:
    async for item in requests:
        if item == b"bad":
            raise invalid("request stream: a bad message")
    return b"done"


async def bidi_stream(requests: AsyncIterator[bytes], context: Any) -> AsyncIterator[bytes]:
    async for item in requests:
        if item == b"bad":
            raise ServiceError(
                grpc.StatusCode.FAILED_PRECONDITION, "SESSION_DEAD", "session died", "task"
            )
        yield item


def _identity(data: bytes) -> bytes:
    return data


def edge_handler() -> grpc.GenericRpcHandler:  # type: ignore[type-arg]
    def uu(fn: Any) -> Any:
        return grpc.unary_unary_rpc_method_handler(fn, _identity, _identity)

    def us(fn: Any) -> Any:
        return grpc.unary_stream_rpc_method_handler(fn, _identity, _identity)

    methods: dict[str, Any] = {
        "Quota": uu(unary_quota),
        "Bug": uu(unary_bug),
        "Disk": uu(unary_disk),
        "Passed": uu(unary_passed),
        "Ok": uu(unary_ok),
        "SyncUnary": uu(sync_unary),
        "AsyncStream": us(async_stream),
        "AsyncStreamBug": us(async_stream_bug),
        "SyncStream": us(sync_stream),
        "Writer": us(writer_stream),
        "RequestStream": grpc.stream_unary_rpc_method_handler(request_stream, _identity, _identity),
        "Bidi": grpc.stream_stream_rpc_method_handler(bidi_stream, _identity, _identity),
    }
    return grpc.method_handlers_generic_handler(SERVICE, methods)


Scenario = Callable[[ServiceRunner, grpc.aio.Channel], Awaitable[None]]


def run_with_server(scenario: Scenario, address_file: Path | None = None) -> None:
    async def main() -> None:
        runner = ServiceRunner(
            "test", "127.0.0.1:0", translate=translate, address_file=address_file
        )
        runner.add_handlers(edge_handler())
        address = await runner.start()
        try:
            async with grpc.aio.insecure_channel(address) as channel:
                await scenario(runner, channel)
        finally:
            await runner.stop(0)

    asyncio.run(main())


def trailers(err: grpc.aio.AioRpcError) -> dict[str, str]:
    received: Any = err.trailing_metadata() or ()
    return {str(k): str(v) for k, v in received}


async def failing_unary(channel: grpc.aio.Channel, method: str) -> grpc.aio.AioRpcError:
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await channel.unary_unary(f"/{SERVICE}/{method}")(b"x", timeout=10)
    return err.value


async def failing_stream(
    channel: grpc.aio.Channel, method: str
) -> tuple[list[bytes], grpc.aio.AioRpcError]:
    got: list[bytes] = []
    with pytest.raises(grpc.aio.AioRpcError) as err:
        async for item in channel.unary_stream(f"/{SERVICE}/{method}")(b"x", timeout=10):
            got.append(item)
    return got, err.value


def test_service_error_leaves_with_code_message_and_trailers() -> None:
    async def scenario(runner: ServiceRunner, channel: grpc.aio.Channel) -> None:
        err = await failing_unary(channel, "Quota")
        assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert err.details() == "over the create rate"
        assert trailers(err) == {
            "orchard-reason": "QUOTA_EXCEEDED",
            "orchard-fault": "client",
            "retry-after": "1.500",
        }
        sync = await failing_unary(channel, "SyncUnary")
        assert (sync.code(), sync.details()) == (
            grpc.StatusCode.INVALID_ARGUMENT,
            "sync: bad field",
        )
        assert trailers(sync)["orchard-fault"] == "client"
        assert await channel.unary_unary(f"/{SERVICE}/Ok")(b"y", timeout=10) == b"ok:y"

    run_with_server(scenario)


def test_a_bug_is_internal_infrastructure_without_its_text() -> None:
    async def scenario(runner: ServiceRunner, channel: grpc.aio.Channel) -> None:
        err = await failing_unary(channel, "Bug")
        assert err.code() == grpc.StatusCode.INTERNAL
        assert err.details() == "the test failed unexpectedly; see its log"
        assert "deadbeef" not in (err.debug_error_string() or "")
        assert trailers(err) == {
            "orchard-reason": "BACKEND_FAILURE",
            "orchard-fault": "infrastructure",
        }
        disk = await failing_unary(channel, "Disk")  # the service's own translation
        assert (disk.code(), disk.details()) == (grpc.StatusCode.RESOURCE_EXHAUSTED, "disk")
        assert trailers(disk) == {"orchard-reason": "DISK_FULL", "orchard-fault": "infrastructure"}

    run_with_server(scenario)


def test_a_passed_on_status_leaves_unchanged() -> None:
    async def scenario(runner: ServiceRunner, channel: grpc.aio.Channel) -> None:
        err = await failing_unary(channel, "Passed")
        assert (err.code(), err.details()) == (grpc.StatusCode.NOT_FOUND, "sandbox sb-1 not found")
        assert trailers(err) == {"orchard-reason": "SANDBOX_NOT_FOUND", "orchard-fault": "client"}

    run_with_server(scenario)


def test_response_streams_fail_after_what_they_sent() -> None:
    async def scenario(runner: ServiceRunner, channel: grpc.aio.Channel) -> None:
        for method, sent, message in (
            ("AsyncStream", [b"first"], "stream: bad after one"),
            ("SyncStream", [b"first", b"second"], "sync stream: bad after two"),
            ("Writer", [b"written"], "writer: bad after one"),
        ):
            got, err = await failing_stream(channel, method)
            assert got == sent, method
            assert (err.code(), err.details()) == (grpc.StatusCode.INVALID_ARGUMENT, message)
            assert trailers(err) == {"orchard-reason": "INVALID_FIELD", "orchard-fault": "client"}
        got, bug = await failing_stream(channel, "AsyncStreamBug")
        assert got == [b"first"] and bug.code() == grpc.StatusCode.INTERNAL
        assert trailers(bug)["orchard-fault"] == "infrastructure"

    run_with_server(scenario)


def test_request_streams() -> None:
    async def requests(*items: bytes) -> AsyncIterator[bytes]:
        for item in items:
            yield item

    async def scenario(runner: ServiceRunner, channel: grpc.aio.Channel) -> None:
        upload = channel.stream_unary(f"/{SERVICE}/RequestStream")
        assert await upload(requests(b"a", b"b"), timeout=10) == b"done"
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await upload(requests(b"a", b"bad"), timeout=10)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert trailers(err.value)["orchard-reason"] == "INVALID_FIELD"
        got: list[bytes] = []
        with pytest.raises(grpc.aio.AioRpcError) as bidi:
            async for item in channel.stream_stream(f"/{SERVICE}/Bidi")(
                requests(b"a", b"bad"), timeout=10
            ):
                got.append(item)
        assert got == [b"a"]
        assert (bidi.value.code(), bidi.value.details()) == (
            grpc.StatusCode.FAILED_PRECONDITION,
            "session died",
        )
        assert trailers(bidi.value) == {"orchard-reason": "SESSION_DEAD", "orchard-fault": "task"}

    run_with_server(scenario)


def test_health_follows_the_runner_and_the_address_file_its_life(tmp_path: Path) -> None:
    addr = tmp_path / "run" / "test.addr"

    async def check(channel: grpc.aio.Channel, service: str = "") -> int:
        stub = health_pb2_grpc.HealthStub(channel)
        answer = await stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=10)
        return int(answer.status)

    async def scenario(runner: ServiceRunner, channel: grpc.aio.Channel) -> None:
        assert await check(channel) == NOT_SERVING  # started, not ready yet
        assert not addr.exists()
        await runner.serving()
        assert await check(channel) == SERVING
        assert await check(channel, SERVICE) == SERVING
        assert addr.read_text() == runner.address + "\n"
        with pytest.raises(grpc.aio.AioRpcError) as unknown:
            await check(channel, "no.such.Service")
        assert unknown.value.code() == grpc.StatusCode.NOT_FOUND
        # A watcher sees NOT_SERVING as soon as the stop begins (its stream is then
        # cancelled at the end of the grace period like every open call).
        watch = health_pb2_grpc.HealthStub(channel).Watch(
            health_pb2.HealthCheckRequest(service=""), timeout=10
        )
        first = await watch.read()
        assert first.status == SERVING
        stopping = asyncio.ensure_future(runner.stop(2))
        second = await watch.read()
        assert second.status == NOT_SERVING
        await stopping
        assert not addr.exists()

    run_with_server(scenario, addr)


def test_public_address() -> None:
    assert public_address("0.0.0.0:0", 5051) == "127.0.0.1:5051"
    assert public_address("[::]:0", 5051) == "127.0.0.1:5051"
    assert public_address(":0", 5051) == "127.0.0.1:5051"
    assert public_address("10.1.2.3:0", 5051) == "10.1.2.3:5051"
    assert public_address("[::1]:0", 5051) == "[::1]:5051"
    assert public_address("unix:/run/x.sock", 1) == "unix:/run/x.sock"
