"""The SDK's data plane (sync and async faces) against a real ``orchard up``."""

from __future__ import annotations

import asyncio
import importlib.metadata
import os
import time
from pathlib import Path

import pytest

import orchard
from orchard import AsyncOrchard, ExecStatus, Orchard, OutputChunk, Sandbox
from tests.stack import Stack

from .test_cli import stack  # noqa: F401  (the fixture)

pytestmark = pytest.mark.runc


def test_sync_face(stack: Stack, tmp_path: Path) -> None:  # noqa: F811
    key = (stack.home / "dev-api-key").read_text().strip()
    client = Orchard(stack.endpoint, key)
    with client.sandboxes.create(cpu=0.5, memory="512Mi", ttl=600) as sb:
        r = sb.exec("echo out; echo err >&2; exit 5", timeout=10)
        assert (r.exit_code, r.stdout, r.stderr_text) == (5, b"out\n", "err\n")
        assert sb.exec(["cat"], stdin="piped").stdout == b"piped"
        events = list(sb.exec_stream(["sh", "-c", "echo a; echo b >&2"]))
        assert OutputChunk("stdout", b"a\n") in events and isinstance(events[-1], ExecStatus)
        assert sb.write_file("/work/x.bin", b"\0" * 1000) == 1000
        assert sb.read_file("/work/x.bin") == b"\0" * 1000
        with pytest.raises(orchard.PathNotFoundError):
            sb.read_file("/work/missing")
        with sb.session() as sh:
            sh.run("cd /work && export X=7")
            assert sh.run("pwd; echo $X").stdout_text == "/work\n7\n"
        (tmp_path / "up").mkdir()
        (tmp_path / "up" / "f").write_bytes(os.urandom(1 << 20))
        sb.upload(tmp_path / "up", "/data")
        result = sb.download("/data", tmp_path / "down")
        assert (
            result.members == 1
            and (tmp_path / "down" / "f").read_bytes() == (tmp_path / "up" / "f").read_bytes()
        )
    # The delete answers at "deleting"; the background teardown then makes it "deleted".
    deadline = time.monotonic() + 30
    state = client.sandboxes.connect(sb.id).last_info.state
    while state == "deleting" and time.monotonic() < deadline:
        time.sleep(0.02)
        state = client.sandboxes.connect(sb.id).last_info.state
    assert state == "deleted"
    client.close()


def test_classmethods_use_a_default_client(stack: Stack) -> None:  # noqa: F811
    """Today's README code (no client object) still works, and shares one client."""
    key = (stack.home / "dev-api-key").read_text().strip()
    with Sandbox.create(endpoint=stack.endpoint, api_key=key) as sb:
        assert sb.exec("echo $((6*7))").stdout == b"42\n"
        again = Sandbox.connect(sb.id, endpoint=stack.endpoint, api_key=key)
        assert again.client is sb.client
        assert sb.id in {i.id for i in Sandbox.list(endpoint=stack.endpoint, api_key=key)}


def test_async_face(stack: Stack, tmp_path: Path) -> None:  # noqa: F811
    key = (stack.home / "dev-api-key").read_text().strip()

    async def scenario() -> None:
        async with (
            AsyncOrchard(stack.endpoint, key) as client,
            await client.sandboxes.create() as sb,
        ):
            results = await asyncio.gather(*(sb.exec(f"echo {i}") for i in range(5)))
            assert [r.stdout_text for r in results] == [f"{i}\n" for i in range(5)]
            chunks = [e async for e in sb.exec_stream("cat", stdin=b"hi")]
            assert OutputChunk("stdout", b"hi") in chunks
            await sb.write_file("/work/a.txt", "text")
            assert await sb.read_file("/work/a.txt") == b"text"
            session = await sb.session()
            assert (await session.run("echo $((1+2))")).stdout == b"3\n"
            await session.close()
            result = await sb.download("/work", tmp_path / "w")
            assert (tmp_path / "w" / "a.txt").read_text() == "text" and result.members == 1

    asyncio.run(scenario())


def test_tenant_view_reports_quota_usage_and_version(stack: Stack) -> None:  # noqa: F811
    key = (stack.home / "dev-api-key").read_text().strip()
    with Orchard(stack.endpoint, key) as client:
        before = client.tenant()
        with client.sandboxes.create(cpu=0.5, memory="256Mi"):
            during = client.tenant()
        assert during.tenant == before.tenant and during.tenant
        assert during.sandboxes == before.sandboxes + 1
        assert during.cpu == before.cpu + 0.5
        assert during.memory_bytes == before.memory_bytes + 256 * 1024 * 1024
        assert during.server_version == importlib.metadata.version("orchard-env")
        assert set(during.quota) == {
            "max_sandboxes", "max_cpu_millis", "max_memory_bytes", "create_rate",
            "create_burst", "max_execs",
        }  # fmt: skip

    async def through_asyncio() -> None:
        async with AsyncOrchard(stack.endpoint, key) as client:
            assert (await client.tenant()).tenant == before.tenant

    asyncio.run(through_asyncio())


class _TextReader:
    """A file object whose read() gives text: its first chunk is only seen mid-stream."""

    def read(self, n: int) -> str:
        return "text, not bytes"


class _FailingReader:
    """A binary file object that fails after its first chunk (a disk error mid-upload)."""

    def __init__(self) -> None:
        self.calls = 0

    def read(self, n: int) -> bytes:
        self.calls += 1
        if self.calls > 1:
            raise OSError(5, "Input/output error (the test's reader)")
        return b"x" * n


def test_write_file_with_bad_data_raises_the_real_error(stack: Stack) -> None:  # noqa: F811
    """Wrong data is a TypeError before any call; a reader failing mid-stream surfaces its own
    error (gRPC cancels a request stream that raised: without care the caller saw
    CancelledError or CANCELLED), on both faces; the sandbox still works after each."""
    key = (stack.home / "dev-api-key").read_text().strip()
    with Orchard(stack.endpoint, key) as client, client.sandboxes.create() as sb:
        for bad in (12, [b"x"], None):
            with pytest.raises(TypeError, match="bytes, str or a binary file object"):
                sb.write_file("/work/f", bad)  # type: ignore[arg-type]
        with pytest.raises(TypeError, match=r"read\(\) gave str"):
            sb.write_file("/work/f", _TextReader())  # type: ignore[arg-type]
        with pytest.raises(OSError, match="the test's reader"):
            sb.write_file("/work/f", _FailingReader())  # type: ignore[arg-type]
        assert sb.exec("ls /work").stdout == b""  # nothing half-written is left
        assert sb.write_file("/work/f", b"ok") == 2

    async def scenario() -> None:
        async with (
            AsyncOrchard(stack.endpoint, key) as client,
            await client.sandboxes.create() as sb,
        ):
            with pytest.raises(TypeError, match="bytes, str or a binary file object"):
                await sb.write_file("/work/f", 12)  # type: ignore[arg-type]
            with pytest.raises(TypeError, match=r"read\(\) gave str"):
                await sb.write_file("/work/f", _TextReader())  # type: ignore[arg-type]
            with pytest.raises(OSError, match="the test's reader"):
                await sb.write_file("/work/f", _FailingReader())  # type: ignore[arg-type]
            assert (await sb.exec("ls /work")).stdout == b""
            assert await sb.write_file("/work/f", b"ok") == 2

    asyncio.run(scenario())


def test_a_silent_exec_outlives_the_clients_keepalive_pings(
    stack: Stack,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A command that prints nothing for minutes (a harness waiting on a slow model, a quiet
    build) keeps its call: the SDK pings its channels (every 30 s), and a server that took
    those pings as abuse (gRPC's default: one per 5 minutes without data, two strikes) sent
    GOAWAY ``too_many_pings`` and the exec was lost after 150 s. Here the client pings every
    10 s (gRPC's floor; the servers accept one per 5 s), so the old failure shows within the
    70 s the command is silent."""
    import orchard.client._core as core

    fast = tuple(
        (k, 10_000 if k == "grpc.keepalive_time_ms" else v) for k, v in core.DEFAULT_CHANNEL_OPTIONS
    )
    monkeypatch.setattr(core, "DEFAULT_CHANNEL_OPTIONS", fast)
    key = (stack.home / "dev-api-key").read_text().strip()
    with Orchard(stack.endpoint, key) as client, client.sandboxes.create() as sb:
        result = sb.exec("sleep 70; echo still-here", timeout=120)
        assert (result.exit_code, result.stdout) == (0, b"still-here\n")
