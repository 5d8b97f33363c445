"""Client-side logic of the SDK, checked on the in-process fake (orchard.testing).

These need no real sandbox: what is under test is what the SDK does around
its calls (files written before create returns, cleanup when that fails, the
context managers, which address the data plane goes to, error mapping), so a
stack would only make them slow. The contract of the real services is tested
against real containers in tests/e2e and tests/executor.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import grpc
import pytest

from orchard import Orchard, PathEscapeError, SandboxNotFoundError
from orchard.testing import FakeOrchard, FakeTransport


@pytest.fixture
def fake() -> Iterator[FakeOrchard]:
    with FakeOrchard() as fake:
        yield fake


def _live(fake: FakeOrchard) -> list[str]:
    return [i for i, rec in fake.world.sandboxes.items() if rec.usable]


def test_create_writes_files_before_returning(fake: FakeOrchard) -> None:
    with (
        fake.client() as client,
        client.sandboxes.create(files={"/a/b.txt": "x", "/c": b"y"}) as sb,
    ):
        assert (fake.root(sb.id) / "a" / "b.txt").read_text() == "x"
        assert sb.read_file("/c") == b"y"
    assert _live(fake) == []  # the context manager deleted it


def test_a_failed_file_write_deletes_the_new_sandbox(fake: FakeOrchard) -> None:
    with fake.client() as client, pytest.raises(PathEscapeError):
        client.sandboxes.create(files={"/ok": "1", "/../escape": "2"})
    assert _live(fake) == []

    async def main() -> None:
        async with fake.async_client() as aclient:
            with pytest.raises(PathEscapeError):
                await aclient.sandboxes.create(files={"/../escape": "2"})

    asyncio.run(main())
    assert _live(fake) == []


def test_exiting_a_deleted_handle_is_quiet(fake: FakeOrchard) -> None:
    with fake.client() as client:
        with client.sandboxes.create() as sb:
            client.sandboxes.delete(sb.id)
        with pytest.raises(SandboxNotFoundError):
            client.sandboxes.delete("fake-doesnotexist")


class _RecordingTransport(FakeTransport):
    def __init__(self, fake: FakeOrchard) -> None:
        super().__init__(fake.router)
        self.addresses: list[str] = []

    def channel(self, address: str) -> grpc.Channel:
        self.addresses.append(address)
        return super().channel(address)


@pytest.mark.parametrize("data_plane", ["direct", "proxy"])
def test_the_data_plane_goes_where_the_mode_says(fake: FakeOrchard, data_plane: str) -> None:
    transport = _RecordingTransport(fake)
    with (
        Orchard(fake.endpoint, fake.api_key, data_plane=data_plane, transport=transport) as client,
        client.sandboxes.create() as sb,
    ):
        assert sb.exec("echo ok").stdout == b"ok\n"
    expected = {fake.endpoint} if data_plane == "proxy" else {fake.endpoint, fake.executor_endpoint}
    assert set(transport.addresses) == expected
