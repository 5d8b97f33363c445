"""The public SDK, unchanged, against the in-process fake: both faces, one scenario each.

This is what a user's unit test of rollout code looks like: ``Orchard`` /
``AsyncOrchard`` with ``transport=fake.transport()`` (or ``fake.client()``),
then the usual calls. Errors must come out as the SDK's own exception tree.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import grpc
import pytest

from orchard import (
    AsyncOrchard,
    AuthenticationError,
    ExecStatus,
    InfrastructureError,
    Orchard,
    OutputChunk,
    PathEscapeError,
    PathNotFoundError,
    QuotaExceededError,
    SandboxNotFoundError,
    ServiceUnavailableError,
)
from orchard.testing import FakeOrchard


def _stdout(events: list[Any]) -> bytes:
    return b"".join(e.data for e in events if isinstance(e, OutputChunk) and e.stream == "stdout")


def _local_tree(root: Path) -> Path:
    src = root / "src"
    (src / "pkg").mkdir(parents=True)
    (src / "pkg" / "mod.py").write_text("X = 1\n")
    (src / "README").write_bytes(b"\x00binary\xff")
    (src / "link").symlink_to("pkg/mod.py")
    return src


def test_sync_client_round_trip(fake: FakeOrchard, tmp_path: Path) -> None:
    with Orchard(fake.endpoint, fake.api_key, transport=fake.transport()) as client:
        sb = client.sandboxes.create(labels={"run": "1"}, env={"GREETING": "hi"})
        assert [s.id for s in client.sandboxes.list({"run": "1"})] == [sb.id]
        result = sb.exec("echo $GREETING; echo err >&2; exit 3")
        assert (result.exit_code, result.stdout, result.stderr) == (3, b"hi\n", b"err\n")
        events = list(sb.exec_stream(["cat"], stdin=[b"a", b"b"]))
        assert _stdout(events) == b"ab"  # in one chunk or two, as the command wrote it
        assert isinstance(events[-1], ExecStatus) and events[-1].exit_code == 0
        with sb.session(cwd="/") as session:
            session.run("mkdir -p work && cd work && VALUE=42")
            again = session.run('echo "$VALUE $(basename "$PWD")"')
            assert again.stdout == b"42 work\n"
        assert sb.write_file("/work/notes.txt", "hello", mode=0o600) == 5
        assert sb.read_file("/work/notes.txt") == b"hello"
        assert (fake.root(sb.id) / "work" / "notes.txt").stat().st_mode & 0o777 == 0o600
        files, size = sb.upload(_local_tree(tmp_path), "/project")
        assert (files, size) == (3, 14)
        out = tmp_path / "out"
        out.mkdir()
        sb.download("/project", out)  # the directory's contents, as the SDK documents
        assert (out / "pkg" / "mod.py").read_text() == "X = 1\n"
        assert (out / "README").read_bytes() == b"\x00binary\xff"
        assert (out / "link").readlink() == Path("pkg/mod.py")
        sb.delete()
        sb.delete()  # idempotent
        assert client.sandboxes.list({"run": "1"}) == []
        with pytest.raises(SandboxNotFoundError):
            client.sandboxes.connect("fake-000000000000")


def test_sync_client_maps_errors(fake: FakeOrchard, client: Orchard) -> None:
    with client.sandboxes.create() as sb:
        with pytest.raises(PathEscapeError):
            sb.read_file("../../etc/passwd")
        with pytest.raises(PathNotFoundError):
            sb.read_file("/missing")
    with Orchard(fake.endpoint, "wrong-key", transport=fake.transport()) as bad:
        with pytest.raises(AuthenticationError) as info:
            bad.sandboxes.list()
        assert info.value.reason == "API_KEY_INVALID" and info.value.code == "UNAUTHENTICATED"


def test_async_client_round_trip(fake: FakeOrchard, tmp_path: Path) -> None:
    async def main() -> None:
        async with AsyncOrchard(
            fake.endpoint, fake.api_key, transport=fake.async_transport()
        ) as client:
            sb = await client.sandboxes.create(labels={"run": "2"})
            result = await sb.exec("printf x; exit 4")
            assert (result.exit_code, result.stdout) == (4, b"x")
            events = [e async for e in sb.exec_stream(["cat"], stdin=b"streamed")]
            assert _stdout(events) == b"streamed"
            session = await sb.session()
            await session.run("cd /tmp && export V=7")
            assert (await session.run("echo $V $PWD")).stdout == b"7 /tmp\n"
            await session.close()
            await sb.write_file("/a/b.txt", b"data")
            assert await sb.read_file("/a/b.txt") == b"data"
            assert await sb.upload(_local_tree(tmp_path), "/up") == (3, 14)
            out = tmp_path / "aout"
            out.mkdir()
            await sb.download("/up/pkg", out)
            assert (out / "mod.py").read_text() == "X = 1\n"
            with pytest.raises(PathEscapeError):
                await sb.read_file("/../x")
            with pytest.raises(PathNotFoundError):
                await sb.read_file("/nope")
            await sb.delete()
            with pytest.raises(SandboxNotFoundError):
                await client.sandboxes.connect("fake-unknown")
        async with fake.async_client(api_key="nope") as bad:
            with pytest.raises(AuthenticationError):
                await bad.images.list()

    asyncio.run(main())


def test_pools_and_images_through_the_client(client: Orchard) -> None:
    names = [i.name for i in client.images.list()]
    assert names == ["debian", "python:3.12"]
    [pool] = client.pools.list()
    assert (pool.template, pool.image, pool.max) == ("py-small", "python:3.12", 4)
    assert client.pools.hint("py-small", 2, within=5).hinted == 2
    assert client.pools.hint("py-small", 3).hinted == 3  # replaces the tenant's last hint
    with client.sandboxes.create(template="py-small") as sb:
        assert (sb.last_info.template, sb.last_info.image) == ("py-small", "python:3.12")
    [after] = client.pools.list()
    assert (after.misses, after.claimed) == (1, 0)


class _CountingInterceptor(grpc.UnaryUnaryClientInterceptor):  # type: ignore[misc,type-arg]
    def __init__(self) -> None:
        self.methods: list[str] = []

    def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
        self.methods.append(details.method.rsplit("/", 1)[1])
        return continuation(details, request)


def test_interceptors_go_to_the_fake_transport(fake: FakeOrchard) -> None:
    counting = _CountingInterceptor()
    with fake.client(interceptors=[counting]) as client, client.sandboxes.create() as sb:
        sb.exec("true")
    assert counting.methods == ["CreateSandbox", "Run", "DeleteSandbox"]


def test_a_client_without_the_fakes_endpoint_is_told_what_to_do(fake: FakeOrchard) -> None:
    with (
        Orchard(transport=fake.transport()) as client,
        pytest.raises(ServiceUnavailableError, match=r"fake\.client\(\)"),
    ):
        client.sandboxes.list()


def test_injected_failures_and_reaped_sandboxes(fake: FakeOrchard, client: Orchard) -> None:
    """What rollout code must survive: an infrastructure failure, a sandbox gone under it."""
    with client.sandboxes.create() as sb:
        fake.fail_next("Run")
        with pytest.raises(InfrastructureError) as info:
            sb.exec("true")
        assert info.value.is_infrastructure and info.value.reason == "BACKEND_FAILURE"
        assert sb.exec("echo recovered").stdout == b"recovered\n"
        fake.fail_next(
            "CreateSandbox",
            grpc.StatusCode.RESOURCE_EXHAUSTED,
            reason="QUOTA_EXCEEDED",
            fault="client",
            times=2,
        )
        for _ in range(2):
            with pytest.raises(QuotaExceededError):
                client.sandboxes.create()
        fake.reap(sb.id)
        with pytest.raises(SandboxNotFoundError):
            sb.exec("true")
        assert client.sandboxes.connect(sb.id).last_info.state_reason == "expired: its ttl passed"
