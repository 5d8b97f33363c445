"""The asyncio face over the fake: concurrency, deadlines and cancellation reach the commands."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import grpc.aio
import pytest

from orchard import AsyncOrchard, AsyncSandbox, AsyncTransport, ExecStatus, OutputChunk, Transport
from orchard.testing import FakeOrchard

from .test_fake_exec import _unique_sleep


async def _wait_gone(box: AsyncSandbox, command: str) -> None:
    deadline = time.monotonic() + 5
    while command.encode() in (await box.exec(["ps", "-eo", "args"])).stdout:
        assert time.monotonic() < deadline, f"{command!r} still runs"
        await asyncio.sleep(0.05)


def test_fake_transports_satisfy_the_seam(fake: FakeOrchard) -> None:
    assert isinstance(fake.transport(), Transport)
    assert isinstance(fake.async_transport(), AsyncTransport)


def test_many_concurrent_execs(fake: FakeOrchard) -> None:
    async def main() -> list[str]:
        async with fake.async_client() as client, await client.sandboxes.create() as box:

            async def worker(i: int) -> str:
                outs = [(await box.exec(["echo", str(i)])).stdout_text for _ in range(5)]
                return outs[-1] if len(set(outs)) == 1 else f"mixed {outs}"

            return await asyncio.gather(*(worker(i) for i in range(24)))

    assert asyncio.run(main()) == [f"{i}\n" for i in range(24)]


def test_timeouts_and_cancelled_tasks_kill_commands(fake: FakeOrchard) -> None:
    async def main() -> None:
        async with fake.async_client() as client, await client.sandboxes.create() as box:
            started = time.monotonic()
            a, b = _unique_sleep(), _unique_sleep()
            r = await box.exec(a, timeout=0.3)
            assert r.status.timed_out and time.monotonic() - started < 5
            with pytest.raises(TimeoutError):
                await asyncio.wait_for(box.exec(b), 0.3)
            await _wait_gone(box, a)
            await _wait_gone(box, b)

    asyncio.run(main())


def test_async_stream_with_async_stdin_and_early_break(fake: FakeOrchard) -> None:
    async def main() -> None:
        async with fake.async_client() as client, await client.sandboxes.create() as box:

            async def feed() -> AsyncIterator[bytes]:
                for piece in (b"one ", b"two"):
                    await asyncio.sleep(0.01)
                    yield piece

            events = [e async for e in box.exec_stream(["cat"], stdin=feed())]
            assert b"".join(e.data for e in events if isinstance(e, OutputChunk)) == b"one two"
            assert isinstance(events[-1], ExecStatus) and events[-1].exit_code == 0
            loop = f"while :; do echo t; {_unique_sleep(0)}; done"
            async for event in box.exec_stream(loop):
                assert event == OutputChunk("stdout", b"t\n")
                break
            await _wait_gone(box, loop)

    asyncio.run(main())


def test_one_fake_serves_both_faces(fake: FakeOrchard) -> None:
    with fake.client() as sync_client:
        sb = sync_client.sandboxes.create()
        sb.write_file("/shared.txt", "from sync")

    async def main() -> bytes:
        async with AsyncOrchard(
            fake.endpoint, fake.api_key, transport=fake.async_transport()
        ) as client:
            box = await client.sandboxes.connect(sb.id)
            return await box.read_file("/shared.txt")

    assert asyncio.run(main()) == b"from sync"


class _Tracing(
    grpc.aio.UnaryUnaryClientInterceptor,
    grpc.aio.UnaryStreamClientInterceptor,
    grpc.aio.StreamUnaryClientInterceptor,
    grpc.aio.StreamStreamClientInterceptor,
):
    """A tracing-style interceptor: names every call, passes it on unchanged."""

    def __init__(self) -> None:
        self.methods: list[str] = []

    async def _pass(self, continuation: Any, details: Any, request: Any) -> Any:
        self.methods.append(details.method.decode().rsplit("/", 1)[1])
        return await continuation(details, request)

    intercept_unary_unary = _pass
    intercept_unary_stream = _pass
    intercept_stream_unary = _pass
    intercept_stream_stream = _pass


def test_aio_interceptors_on_the_async_client(fake: FakeOrchard, tmp_path: Path) -> None:
    tracing = _Tracing()
    (tmp_path / "up").mkdir()
    (tmp_path / "up" / "f").write_text("data")

    async def main() -> None:
        async with (
            fake.async_client(interceptors=[tracing]) as client,
            await client.sandboxes.create() as box,
        ):
            assert (await box.exec("echo hi")).stdout == b"hi\n"
            chunks = [e async for e in box.exec_stream(["cat"], stdin=b"x")]
            assert isinstance(chunks[-1], ExecStatus)
            await box.write_file("/w", "v")
            assert await box.read_file("/w") == b"v"
            await box.upload(tmp_path / "up", "/up")
            await box.download("/up", tmp_path / "down")
            assert (tmp_path / "down" / "f").read_text() == "data"

    asyncio.run(main())
    assert tracing.methods == [
        "CreateSandbox", "Run", "Exec", "WriteFile", "ReadFile", "Upload", "Download",
        "DeleteSandbox",
    ]  # fmt: skip
