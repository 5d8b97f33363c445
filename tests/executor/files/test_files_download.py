"""Download: tar streams of files and trees, confined, with backpressure."""

from __future__ import annotations

import asyncio
import os
import shutil
import socket
import stat
import subprocess
import threading
from collections.abc import Callable

import grpc
import pytest
from orchard.executor.files.bridge import stream_from_thread

from .conftest import HOST_SECRET, Sandbox, assert_refused, chunks, collect, run
from .tarbuild import contents, parse


def download(sandbox: Sandbox, path: str) -> bytes:
    return b"".join(run(collect(sandbox.files.download(path))))


def make_tree(sandbox: Sandbox) -> None:
    top = sandbox.root / "home/agent/proj"
    (top / "src/pkg").mkdir(parents=True)
    (top / "src/pkg/mod.py").write_bytes(b"print('hi')\n")
    (top / "README").write_bytes(b"readme")
    (top / "empty").write_bytes(b"")
    (top / "big.bin").write_bytes(os.urandom(3 << 20))
    os.chmod(top / "README", 0o640)
    os.utime(top / "README", (1_400_000_000, 1_400_000_000))
    (top / "rel-link").symlink_to("README")
    (top / "host-link").symlink_to(sandbox.secret)
    (top / "host-dir").symlink_to(sandbox.host)
    (top / "up").symlink_to("../../..")
    os.link(top / "README", top / "src/hard")
    os.mkfifo(top / "fifo")


def test_tree(sandbox: Sandbox) -> None:
    make_tree(sandbox)
    data = download(sandbox, "/home/agent/proj")
    members = parse(data)
    files = contents(data)
    assert HOST_SECRET not in data
    assert files["proj/README"] == b"readme"
    assert files["proj/src/pkg/mod.py"] == b"print('hi')\n"
    assert files["proj/big.bin"] == (sandbox.root / "home/agent/proj/big.bin").read_bytes()
    assert files["proj/empty"] == b""
    assert members["proj"].isdir() and members["proj/src/pkg"].isdir()
    assert members["proj/README"].mode == 0o640
    assert members["proj/README"].mtime == 1_400_000_000
    assert members["proj/rel-link"].issym() and members["proj/rel-link"].linkname == "README"
    assert members["proj/host-link"].linkname == str(sandbox.secret)  # stored, not followed
    assert members["proj/host-dir"].issym()
    assert members["proj/up"].issym()
    hard = [n for n in ("proj/README", "proj/src/hard") if members[n].islnk()]
    assert len(hard) == 1  # the second name of the inode is a hard link to the first
    assert "proj/fifo" not in members  # special files are skipped
    assert not any(name.startswith("proj/host-dir/") for name in members)


def test_round_trip_through_upload(sandbox: Sandbox) -> None:
    make_tree(sandbox)
    (sandbox.root / "home/agent/proj/host-link").unlink()  # absolute: upload refuses it
    (sandbox.root / "home/agent/proj/host-dir").unlink()
    (sandbox.root / "home/agent/proj/up").unlink()
    data = download(sandbox, "/home/agent/proj")
    files, size = run(sandbox.files.upload("/copy", chunks([data])))
    assert files == 6  # README, mod.py, empty, big.bin, rel-link, hard (fifo skipped)
    a, b = sandbox.root / "home/agent/proj", sandbox.root / "copy/proj"
    for rel in ("README", "src/pkg/mod.py", "big.bin", "empty", "src/hard"):
        assert (a / rel).read_bytes() == (b / rel).read_bytes()
        assert stat.S_IMODE((a / rel).stat().st_mode) == stat.S_IMODE((b / rel).stat().st_mode)
    assert (b / "README").stat().st_mtime == 1_400_000_000
    assert (b / "src/hard").stat().st_ino == (b / "README").stat().st_ino
    assert os.readlink(b / "rel-link") == "README"
    assert size == sum((a / r).stat().st_size for r in ("README", "src/pkg/mod.py", "big.bin"))


def test_single_file_and_symlinked_path(sandbox: Sandbox) -> None:
    (sandbox.root / "tmp/link").symlink_to("/etc/passwd")
    for path in ("/etc/passwd", "/tmp/link"):
        members = parse(download(sandbox, path))
        assert list(members) == [path.rsplit("/", 1)[1]]


def test_root_download(sandbox: Sandbox) -> None:
    names = set(parse(download(sandbox, "/")))
    assert {".", "./etc", "./etc/passwd", "./home/agent"} <= names


def test_gnu_tar_reads_it(sandbox: Sandbox) -> None:
    gnu_tar = shutil.which("tar")
    if gnu_tar is None:
        pytest.skip("no tar binary")
    make_tree(sandbox)
    (sandbox.root / "home/agent/proj" / ("n" * 200)).write_bytes(b"long name")
    data = download(sandbox, "/home/agent/proj")
    listing = subprocess.run(
        [gnu_tar, "-tvf", "-"], input=data, capture_output=True, check=True
    ).stdout.decode()
    assert "proj/src/pkg/mod.py" in listing
    assert "proj/" + "n" * 200 in listing


def test_missing_and_special(sandbox: Sandbox) -> None:
    assert_refused(
        collect(sandbox.files.download("/nope")), grpc.StatusCode.NOT_FOUND, "PATH_NOT_FOUND"
    )
    s = socket.socket(socket.AF_UNIX)
    try:
        s.bind(str(sandbox.root / "tmp/sock"))
        assert_refused(
            collect(sandbox.files.download("/tmp/sock")),
            grpc.StatusCode.FAILED_PRECONDITION,
            "UNSUPPORTED_FILE_TYPE",
        )
        assert "tmp/sock" not in parse(download(sandbox, "/tmp"))
    finally:
        s.close()


def test_device_nodes_in_tree_are_skipped_unopened(sandbox: Sandbox) -> None:
    dev = sandbox.root / "dev"
    dev.mkdir()
    try:
        os.mknod(dev / "zero", 0o666 | stat.S_IFCHR, os.makedev(1, 5))
    except PermissionError:
        pytest.skip("mknod needs CAP_MKNOD")
    (dev / "ok").write_bytes(b"ok")
    assert set(parse(download(sandbox, "/dev"))) == {"dev", "dev/ok"}


def test_deep_tree_does_not_exhaust_fds(sandbox: Sandbox) -> None:
    path = sandbox.root / "deep"
    fd = os.open(sandbox.root, os.O_RDONLY)
    try:
        os.mkdir("deep", dir_fd=fd)
        cur = os.open("deep", os.O_RDONLY, dir_fd=fd)
        for _ in range(300):  # deeper than PATH_MAX allows by name
            os.mkdir("d" * 30, dir_fd=cur)
            nxt = os.open("d" * 30, os.O_RDONLY, dir_fd=cur)
            os.close(cur)
            cur = nxt
        os.close(cur)
    finally:
        os.close(fd)
    assert path.is_dir()
    members = parse(download(sandbox, "/deep"))
    # Members deeper than the kernel's 4096-byte lookup limit cannot be reopened
    # by path and are skipped; everything above is there.
    assert len(members) > 100


def test_slow_consumer_applies_backpressure() -> None:
    produced = 0
    done = threading.Event()

    def produce(send: Callable[[bytes], None]) -> None:
        nonlocal produced
        try:
            for _ in range(1000):
                send(b"x" * 1024)
                produced += 1
        finally:
            done.set()

    async def scenario() -> int:
        gen = stream_from_thread(produce, max_pending=4)
        await gen.__anext__()
        await asyncio.sleep(0.2)
        seen = produced
        await gen.aclose()  # type: ignore[attr-defined]
        return seen

    seen = run(scenario())
    assert seen <= 6  # the window (4) plus what was in flight
    assert done.wait(2)  # the producer stopped after the consumer left
    assert produced < 1000
