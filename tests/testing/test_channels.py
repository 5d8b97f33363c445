"""The fake's channels behave like grpcio's, sync and grpc.aio alike.

A small echo service (plain bytes, identity serializers would hide encoding
bugs, so it uses the real ``executor_pb2`` messages) is registered on the
fake's router next to nothing else: it shows the channel machinery on its
own, independently of the Orchard servicers.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from typing import Any

import grpc
import grpc.aio
import pytest

from orchard._proto.orchard.v1 import executor_pb2 as pb
from orchard.testing._aio_channel import AsyncFakeChannel
from orchard.testing._channel import FakeChannel
from orchard.testing._router import Router

SERVICE = "test.Echo"
ADDRESS = "echo.invalid:1"


class EchoServicer:
    """Echoes TarChunk data; 'fail' aborts with trailers; 'sleep' waits for the deadline."""

    def __init__(self) -> None:
        self.seen_metadata: list[Any] = []
        self.ended = threading.Event()

    def Unary(self, request: pb.TarChunk, context: grpc.ServicerContext) -> pb.TarChunk:
        self.seen_metadata.append(tuple(context.invocation_metadata()))
        if request.data == b"fail":
            context.set_trailing_metadata((("orchard-reason", "PATH_ESCAPE"),))
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "no escape")
        if request.data == b"sleep":
            context.add_callback(self.ended.set)
            while context.is_active():
                time.sleep(0.01)
        if request.data == b"crash":
            raise RuntimeError("boom")
        return pb.TarChunk(data=request.data.upper())

    def Many(self, request: pb.TarChunk, context: grpc.ServicerContext) -> Iterator[pb.TarChunk]:
        context.add_callback(self.ended.set)
        for i in range(int(request.data or b"1000000")):
            yield pb.TarChunk(data=str(i).encode())
            if not context.is_active():
                return

    def Join(self, requests: Iterator[pb.TarChunk], context: grpc.ServicerContext) -> pb.TarChunk:
        return pb.TarChunk(data=b"".join(r.data for r in requests))

    def Both(
        self, requests: Iterator[pb.TarChunk], context: grpc.ServicerContext
    ) -> Iterator[pb.TarChunk]:
        for r in requests:
            if r.data == b"fail":
                context.abort(grpc.StatusCode.NOT_FOUND, "gone")
            yield pb.TarChunk(data=r.data[::-1])


def _add(servicer: EchoServicer, server: Any) -> None:
    des, ser = pb.TarChunk.FromString, pb.TarChunk.SerializeToString
    server.add_generic_rpc_handlers(
        (
            grpc.method_handlers_generic_handler(
                SERVICE,
                {
                    "Unary": grpc.unary_unary_rpc_method_handler(servicer.Unary, des, ser),
                    "Many": grpc.unary_stream_rpc_method_handler(servicer.Many, des, ser),
                    "Join": grpc.stream_unary_rpc_method_handler(servicer.Join, des, ser),
                    "Both": grpc.stream_stream_rpc_method_handler(servicer.Both, des, ser),
                },
            ),
        )
    )


@pytest.fixture
def echo() -> tuple[Router, EchoServicer]:
    router = Router()
    servicer = EchoServicer()
    router.serve(ADDRESS, (_add, servicer))
    return router, servicer


def _methods(channel: Any) -> dict[str, Any]:
    kw = {
        "request_serializer": pb.TarChunk.SerializeToString,
        "response_deserializer": pb.TarChunk.FromString,
    }
    return {
        "unary": channel.unary_unary(f"/{SERVICE}/Unary", **kw),
        "many": channel.unary_stream(f"/{SERVICE}/Many", **kw),
        "join": channel.stream_unary(f"/{SERVICE}/Join", **kw),
        "both": channel.stream_stream(f"/{SERVICE}/Both", **kw),
    }


def _chunks(*data: bytes) -> Iterator[pb.TarChunk]:
    for d in data:
        yield pb.TarChunk(data=d)


# ---- sync --------------------------------------------------------------------


def test_sync_channel_is_a_grpc_channel_and_runs_all_four_kinds(
    echo: tuple[Router, EchoServicer],
) -> None:
    router, servicer = echo
    channel = FakeChannel(router, ADDRESS)
    assert isinstance(channel, grpc.Channel)
    m = _methods(channel)
    assert m["unary"](pb.TarChunk(data=b"hi"), metadata=(("k", "v"),)).data == b"HI"
    assert servicer.seen_metadata[-1] == (("k", "v"),)
    response, call = m["unary"].with_call(pb.TarChunk(data=b"x"))
    assert response.data == b"X" and call.code() == grpc.StatusCode.OK
    future = m["unary"].future(pb.TarChunk(data=b"f"))
    assert future.result(timeout=5).data == b"F"
    assert [c.data for c in m["many"](pb.TarChunk(data=b"3"))] == [b"0", b"1", b"2"]
    assert m["join"](_chunks(b"a", b"b", b"c")).data == b"abc"
    assert [c.data for c in m["both"](_chunks(b"ab", b"cd"))] == [b"ba", b"dc"]


def test_sync_errors_are_rpc_errors_and_calls_with_trailers(
    echo: tuple[Router, EchoServicer],
) -> None:
    m = _methods(FakeChannel(echo[0], ADDRESS))
    with pytest.raises(grpc.RpcError) as info:
        m["unary"](pb.TarChunk(data=b"fail"))
    err = info.value
    assert isinstance(err, grpc.Call)
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert err.details() == "no escape"
    assert ("orchard-reason", "PATH_ESCAPE") in err.trailing_metadata()
    with pytest.raises(grpc.RpcError) as crash:
        m["unary"](pb.TarChunk(data=b"crash"))
    assert crash.value.code() == grpc.StatusCode.UNKNOWN
    assert "boom" in crash.value.details()
    stream = m["both"](_chunks(b"ab", b"fail"))
    assert next(stream).data == b"ba"
    with pytest.raises(grpc.RpcError) as streamed:
        next(stream)
    assert streamed.value.code() == grpc.StatusCode.NOT_FOUND


def test_sync_deadline_exceeded_fires_the_servicer_callbacks(
    echo: tuple[Router, EchoServicer],
) -> None:
    router, servicer = echo
    m = _methods(FakeChannel(router, ADDRESS))
    started = time.monotonic()
    with pytest.raises(grpc.RpcError) as info:
        m["unary"](pb.TarChunk(data=b"sleep"), timeout=0.2)
    assert info.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    assert time.monotonic() - started < 5
    assert servicer.ended.wait(5)


def test_sync_stream_cancel_stops_the_servicer(echo: tuple[Router, EchoServicer]) -> None:
    router, servicer = echo
    call = _methods(FakeChannel(router, ADDRESS))["many"](pb.TarChunk())
    assert next(call).data == b"0"
    assert call.cancel()
    assert servicer.ended.wait(5)
    assert call.code() == grpc.StatusCode.CANCELLED
    with pytest.raises(grpc.RpcError):
        next(call)


def test_futures_keep_their_outcome_and_callbacks_never_block(
    echo: tuple[Router, EchoServicer],
) -> None:
    m = _methods(FakeChannel(echo[0], ADDRESS))
    failed = m["unary"].future(pb.TarChunk(data=b"fail"))
    for _ in range(2):  # asked twice, the same failure
        with pytest.raises(grpc.RpcError) as info:
            failed.result(timeout=5)
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert failed.exception(timeout=5).code() == grpc.StatusCode.INVALID_ARGUMENT
    slow = m["unary"].future(pb.TarChunk(data=b"sleep"), timeout=0.5)
    seen: list[grpc.StatusCode] = []
    started = time.monotonic()
    slow.add_done_callback(lambda call: seen.append(call.code()))
    slow.add_done_callback(lambda call: seen.append(call.code()))
    assert time.monotonic() - started < 0.2  # registering a callback does not wait
    with pytest.raises(grpc.RpcError):
        slow.result()
    deadline = time.monotonic() + 5
    while len(seen) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert seen == [grpc.StatusCode.DEADLINE_EXCEEDED] * 2
    done = m["unary"].future(pb.TarChunk(data=b"ok"))
    assert done.result(timeout=5).data == b"OK"
    late: list[object] = []
    done.add_done_callback(late.append)  # already done: called at once
    assert late == [done]


def test_unknown_address_and_method(echo: tuple[Router, EchoServicer]) -> None:
    router, _ = echo
    with pytest.raises(grpc.RpcError) as unavailable:
        _methods(FakeChannel(router, "elsewhere:1"))["unary"](pb.TarChunk())
    assert unavailable.value.code() == grpc.StatusCode.UNAVAILABLE
    assert ADDRESS in unavailable.value.details()
    missing = FakeChannel(router, ADDRESS).unary_unary("/test.Echo/Nope")
    with pytest.raises(grpc.RpcError) as unimplemented:
        missing(b"")
    assert unimplemented.value.code() == grpc.StatusCode.UNIMPLEMENTED


class _Counting(grpc.UnaryUnaryClientInterceptor, grpc.UnaryStreamClientInterceptor):  # type: ignore[misc,type-arg]
    def __init__(self) -> None:
        self.calls: list[str] = []
        self.codes: list[grpc.StatusCode] = []

    def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
        self.calls.append(details.method)
        outcome = continuation(details, request)
        self.codes.append(outcome.code())
        return outcome

    def intercept_unary_stream(self, continuation: Any, details: Any, request: Any) -> Any:
        self.calls.append(details.method)
        return continuation(details, request)


def test_grpc_interceptors_run_over_the_fake_channel(echo: tuple[Router, EchoServicer]) -> None:
    counting = _Counting()
    channel = grpc.intercept_channel(FakeChannel(echo[0], ADDRESS), counting)
    m = _methods(channel)
    assert m["unary"](pb.TarChunk(data=b"a")).data == b"A"
    with pytest.raises(grpc.RpcError) as info:
        m["unary"](pb.TarChunk(data=b"fail"))
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert [c.data for c in m["many"](pb.TarChunk(data=b"2"))] == [b"0", b"1"]
    assert counting.calls == [f"/{SERVICE}/Unary", f"/{SERVICE}/Unary", f"/{SERVICE}/Many"]
    assert counting.codes == [grpc.StatusCode.OK, grpc.StatusCode.INVALID_ARGUMENT]


# ---- grpc.aio -------------------------------------------------------------------


def test_aio_channel_runs_all_four_kinds(echo: tuple[Router, EchoServicer]) -> None:
    router, servicer = echo

    async def main() -> None:
        channel = AsyncFakeChannel(router, ADDRESS)
        assert isinstance(channel, grpc.aio.Channel)
        m = _methods(channel)
        call = m["unary"](pb.TarChunk(data=b"hi"), metadata=(("k", "v"),))
        assert (await call).data == b"HI"
        assert await call.code() == grpc.StatusCode.OK
        assert servicer.seen_metadata[-1] == (("k", "v"),)
        assert [c.data async for c in m["many"](pb.TarChunk(data=b"3"))] == [b"0", b"1", b"2"]

        async def agen() -> Any:
            for d in (b"a", b"b"):
                yield pb.TarChunk(data=d)

        assert (await m["join"](agen())).data == b"ab"
        assert (await m["join"](iter([pb.TarChunk(data=b"z")]))).data == b"z"
        both = m["both"]()
        await both.write(pb.TarChunk(data=b"ab"))
        assert (await both.read()).data == b"ba"
        await both.done_writing()
        assert await both.read() is grpc.aio.EOF  # type: ignore[attr-defined]

    asyncio.run(main())


def test_aio_errors_deadline_and_cancel(echo: tuple[Router, EchoServicer]) -> None:
    router, servicer = echo

    async def main() -> None:
        m = _methods(AsyncFakeChannel(router, ADDRESS))
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await m["unary"](pb.TarChunk(data=b"fail"))
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert ("orchard-reason", "PATH_ESCAPE") in list(info.value.trailing_metadata())
        with pytest.raises(grpc.aio.AioRpcError) as late:
            await m["unary"](pb.TarChunk(data=b"sleep"), timeout=0.2)
        assert late.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        assert servicer.ended.wait(5)
        servicer.ended.clear()
        stream = m["many"](pb.TarChunk())
        assert (await stream.read()).data == b"0"
        assert stream.cancel()
        assert stream.cancelled()
        assert servicer.ended.wait(5)

    asyncio.run(main())


def test_aio_task_cancel_cancels_the_call(echo: tuple[Router, EchoServicer]) -> None:
    router, servicer = echo

    async def main() -> None:
        m = _methods(AsyncFakeChannel(router, ADDRESS))
        task = asyncio.ensure_future(m["unary"](pb.TarChunk(data=b"sleep")))
        await asyncio.sleep(0.1)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert await asyncio.to_thread(servicer.ended.wait, 5)

    asyncio.run(main())


class _AioRecorder(
    grpc.aio.UnaryUnaryClientInterceptor,
    grpc.aio.UnaryStreamClientInterceptor,
    grpc.aio.StreamUnaryClientInterceptor,
    grpc.aio.StreamStreamClientInterceptor,
):
    """Adds a metadata entry and records each method with its final status."""

    def __init__(self) -> None:
        self.seen: list[tuple[bytes, grpc.StatusCode]] = []

    def _details(self, details: Any) -> Any:
        metadata = (*(details.metadata or ()), ("x-traced", "1"))
        return grpc.aio.ClientCallDetails(details.method, details.timeout, metadata, None, None)

    async def _record(self, continuation: Any, details: Any, request: Any) -> Any:
        call = await continuation(self._details(details), request)
        call.add_done_callback(lambda _: None)
        return call

    intercept_unary_stream = _record
    intercept_stream_stream = _record

    async def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
        call = await continuation(self._details(details), request)
        try:
            await call
        finally:
            self.seen.append((details.method, await call.code()))
        return call

    async def intercept_stream_unary(self, continuation: Any, details: Any, request: Any) -> Any:
        return await self.intercept_unary_unary(continuation, details, request)


class _Answering(grpc.aio.UnaryUnaryClientInterceptor):
    """Answers 'cached' itself without calling on (what a caching interceptor does)."""

    async def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
        if request.data == b"cached":
            return pb.TarChunk(data=b"from cache")
        return await continuation(details, request)


def test_aio_interceptors_run_over_the_fake_channel(echo: tuple[Router, EchoServicer]) -> None:
    router, servicer = echo
    recorder = _AioRecorder()

    async def main() -> None:
        m = _methods(AsyncFakeChannel(router, ADDRESS, (recorder, _Answering())))
        assert (await m["unary"](pb.TarChunk(data=b"hi"))).data == b"HI"
        assert ("x-traced", "1") in servicer.seen_metadata[-1]
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await m["unary"](pb.TarChunk(data=b"fail"))
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        cached = m["unary"](pb.TarChunk(data=b"cached"))
        assert (await cached).data == b"from cache"
        assert await cached.code() == grpc.StatusCode.OK
        many = m["many"](pb.TarChunk(data=b"3"))
        assert [c.data async for c in many] == [b"0", b"1", b"2"]
        assert await many.code() == grpc.StatusCode.OK

        async def chunks() -> Any:
            for d in (b"a", b"b"):
                yield pb.TarChunk(data=d)

        assert (await m["join"](chunks())).data == b"ab"
        both = m["both"]()
        await both.write(pb.TarChunk(data=b"xy"))
        await both.done_writing()
        assert [c.data async for c in both] == [b"yx"]

    asyncio.run(main())
    assert recorder.seen == [
        (f"/{SERVICE}/Unary".encode(), grpc.StatusCode.OK),
        (f"/{SERVICE}/Unary".encode(), grpc.StatusCode.INVALID_ARGUMENT),
        (f"/{SERVICE}/Unary".encode(), grpc.StatusCode.OK),
        (f"/{SERVICE}/Join".encode(), grpc.StatusCode.OK),
    ]
