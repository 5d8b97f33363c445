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
