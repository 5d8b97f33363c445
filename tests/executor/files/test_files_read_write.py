"""ReadFile / WriteFile round trips, modes, parents, atomicity and cleanup."""

from __future__ import annotations

import asyncio
import os
import stat
import tracemalloc
from collections.abc import AsyncIterator

import grpc
import pytest

from .conftest import Sandbox, assert_refused, chunks, collect, run, sha

MiB = 1 << 20


def read_all(sandbox: Sandbox, path: str) -> tuple[int, int, bytes, int]:
    """(size, mode, data, number of chunks) of a ReadFile."""
    got = run(collect(sandbox.files.read_file(path)))
    assert got[0].HasField("info")
    assert not any(c.HasField("info") for c in got[1:])
    return got[0].info.size, got[0].info.mode, b"".join(c.data for c in got), len(got)


@pytest.mark.parametrize("data", [b"", b"x", b"\0\xff" * 1000, os.urandom(3 * MiB + 17)])
def test_round_trip(sandbox: Sandbox, data: bytes) -> None:
    parts = [data[i : i + 100_000] for i in range(0, len(data), 100_000)]
    assert run(sandbox.files.write_file("/tmp/f.bin", 0, False, chunks(parts))) == len(data)
    assert (sandbox.root / "tmp/f.bin").read_bytes() == data
    size, mode, back, count = read_all(sandbox, "/tmp/f.bin")
    assert (size, mode, back) == (len(data), 0o644, data)
    assert count == max(1, -(-len(data) // MiB))  # ~1 MiB chunks, info on the first


def test_large_file_streams_without_holding_it(sandbox: Sandbox) -> None:
    """64 MiB each way; peak Python allocations stay at a few chunks."""
    size = 64 * MiB
    block = os.urandom(MiB)

    async def source() -> AsyncIterator[bytes]:
        for _ in range(size // MiB):
            yield block

    async def write_then_read() -> tuple[int, int, str]:
        written = await sandbox.files.write_file("/big", 0o600, False, source())
        total, digest, chunks_seen = 0, None, 0
        import hashlib

        h = hashlib.sha256()
        async for chunk in sandbox.files.read_file("/big"):
            h.update(chunk.data)
            total += len(chunk.data)
            chunks_seen += 1
        digest = h.hexdigest()
        assert chunks_seen == size // MiB
        return written, total, digest

    tracemalloc.start()
    try:
        written, total, digest = run(write_then_read())
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert written == total == size
    assert digest == sha(block * (size // MiB))
    assert peak < 16 * MiB, f"peak traced memory {peak / MiB:.1f} MiB"
    assert stat.S_IMODE((sandbox.root / "big").stat().st_mode) == 0o600


@pytest.mark.parametrize(("mode", "expect"), [(0, 0o644), (0o755, 0o755), (0o100600, 0o600)])
def test_modes(sandbox: Sandbox, mode: int, expect: int) -> None:
    old = os.umask(0o077)
    try:
        run(sandbox.files.write_file("/m", mode, False, chunks([b"x"])))
    finally:
        os.umask(old)
    assert stat.S_IMODE((sandbox.root / "m").stat().st_mode) == expect
    assert read_all(sandbox, "/m")[1] == expect


def test_bad_mode_is_refused(sandbox: Sandbox) -> None:
    assert_refused(
        sandbox.files.write_file("/m", 0o40755, False, chunks([b"x"])),
        grpc.StatusCode.INVALID_ARGUMENT,
        "INVALID_FIELD",
    )
    assert not (sandbox.root / "m").exists()


def test_make_parents(sandbox: Sandbox) -> None:
    run(sandbox.files.write_file("/new/deep/dir/f", 0, True, chunks([b"ok"])))
    assert (sandbox.root / "new/deep/dir/f").read_bytes() == b"ok"
    assert (sandbox.root / "new/deep").is_dir()


def test_missing_parent_without_make_parents(sandbox: Sandbox) -> None:
    err = assert_refused(
        sandbox.files.write_file("/nope/f", 0, False, chunks([b"x"])),
        grpc.StatusCode.NOT_FOUND,
        "PATH_NOT_FOUND",
    )
    assert "/nope" in err.message
    assert not (sandbox.root / "nope").exists()


def test_parent_is_a_file(sandbox: Sandbox) -> None:
    (sandbox.root / "file").write_bytes(b"")
    for make_parents in (False, True):
        assert_refused(
            sandbox.files.write_file("/file/child", 0, make_parents, chunks([b"x"])),
            grpc.StatusCode.FAILED_PRECONDITION,
            "NOT_A_DIRECTORY",
        )


def test_write_onto_directory(sandbox: Sandbox) -> None:
    for path in ("/tmp", "/"):
        assert_refused(
            sandbox.files.write_file(path, 0, False, chunks([b"x"])),
            grpc.StatusCode.FAILED_PRECONDITION,
            "IS_A_DIRECTORY",
        )
    assert list((sandbox.root / "tmp").iterdir()) == []


def test_read_directory_and_missing(sandbox: Sandbox) -> None:
    assert_refused(
        collect(sandbox.files.read_file("/etc")),
        grpc.StatusCode.FAILED_PRECONDITION,
        "IS_A_DIRECTORY",
    )
    assert_refused(
        collect(sandbox.files.read_file("/etc/shadow")), grpc.StatusCode.NOT_FOUND, "PATH_NOT_FOUND"
    )


def test_atomic_replace_keeps_owner_and_leaves_no_temp(sandbox: Sandbox) -> None:
    target = sandbox.root / "home/agent/notes"
    target.write_bytes(b"old")
    os.chown(target, 1000, 1000)
    inode = target.stat().st_ino
    run(sandbox.files.write_file("/home/agent/notes", 0o640, False, chunks([b"new", b"!"])))
    st = target.stat()
    assert target.read_bytes() == b"new!"
    assert st.st_ino != inode  # a new file renamed over the old one
    assert (st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)) == (1000, 1000, 0o640)
    assert sorted(p.name for p in target.parent.iterdir()) == ["notes"]


def test_failed_stream_leaves_old_content_and_no_temp(sandbox: Sandbox) -> None:
    target = sandbox.root / "tmp/keep"
    target.write_bytes(b"original")

    async def broken() -> AsyncIterator[bytes]:
        yield b"partial data"
        await asyncio.sleep(0.01)
        raise ConnectionError("client went away")

    with pytest.raises(ConnectionError):
        run(sandbox.files.write_file("/tmp/keep", 0, False, broken()))
    assert target.read_bytes() == b"original"
    assert sorted(p.name for p in target.parent.iterdir()) == ["keep"]


def test_cancelled_write_cleans_up(sandbox: Sandbox) -> None:
    async def scenario() -> None:
        never = asyncio.Event()

        async def stalls() -> AsyncIterator[bytes]:
            yield b"some"
            await never.wait()
            yield b"never"

        task = asyncio.ensure_future(sandbox.files.write_file("/tmp/c", 0, False, stalls()))
        await asyncio.sleep(0.05)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    run(scenario())
    assert list((sandbox.root / "tmp").iterdir()) == []


def test_abandoned_read_stops_the_worker(sandbox: Sandbox) -> None:
    (sandbox.root / "big").write_bytes(b"\1" * (32 * MiB))
    before = len(os.listdir("/proc/self/fd"))

    async def scenario() -> None:
        reader = sandbox.files.read_file("/big")
        first = await reader.__anext__()
        assert first.info.size == 32 * MiB
        await reader.aclose()  # type: ignore[attr-defined]
        await asyncio.sleep(0.2)  # the worker notices at its next chunk

    run(scenario())
    assert len(os.listdir("/proc/self/fd")) <= before
