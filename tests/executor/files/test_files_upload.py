"""Upload: unpacking tar streams into the sandbox, and every way an archive tries to get out."""

from __future__ import annotations

import os
import stat
import tarfile
import tracemalloc
import zlib
from collections.abc import AsyncIterator

import grpc
import pytest
from orchard.executor.files.decompress import open_decoded

from .conftest import HOST_SECRET, SANDBOX_PASSWD, Sandbox, assert_refused, chunks, run
from .tarbuild import Member, build, split

REG, DIR, SYM, LNK = tarfile.REGTYPE, tarfile.DIRTYPE, tarfile.SYMTYPE, tarfile.LNKTYPE


def upload(sandbox: Sandbox, dest: str, data: bytes, size: int = 65536) -> tuple[int, int]:
    return run(sandbox.files.upload(dest, chunks(split(data, size))))


def test_tree_with_modes_mtimes_links(sandbox: Sandbox) -> None:
    data = build(
        [
            Member("proj/", DIR, mode=0o750, mtime=1_500_000_000),
            Member("proj/bin/run.sh", data=b"#!/bin/sh\necho hi\n", mode=0o755),
            Member("proj/readme", data=b"hello", mode=0o600, mtime=1_234_567_890),
            Member("proj/empty", data=b""),
            Member("proj/link", SYM, linkname="readme"),
            Member("proj/bin/up", SYM, linkname="../readme"),
            Member("proj/hard", LNK, linkname="proj/readme"),
        ]
    )
    assert upload(sandbox, "/home/agent/work", data, size=100) == (6, 23)
    top = sandbox.root / "home/agent/work/proj"
    assert (top / "bin/run.sh").read_bytes() == b"#!/bin/sh\necho hi\n"
    assert stat.S_IMODE((top / "bin/run.sh").stat().st_mode) == 0o755
    assert stat.S_IMODE((top / "readme").stat().st_mode) == 0o600
    assert (top / "readme").stat().st_mtime == 1_234_567_890
    assert os.readlink(top / "link") == "readme"
    assert (top / "bin/up").read_bytes() == b"hello"
    assert (top / "hard").stat().st_ino == (top / "readme").stat().st_ino
    assert stat.S_IMODE(top.stat().st_mode) == 0o750
    assert top.stat().st_mtime == 1_500_000_000  # applied after the children


@pytest.mark.parametrize("compression", ["gz", "bz2", "xz"])
def test_compressed_streams(sandbox: Sandbox, compression: str) -> None:
    payload = os.urandom(200_000) + b"\0" * 300_000
    data = build([Member("a/b", data=payload)], compression=compression)
    assert upload(sandbox, "/x", data, size=1000) == (1, len(payload))
    assert (sandbox.root / "x/a/b").read_bytes() == payload


def test_missing_directory_entries_and_existing_destination(sandbox: Sandbox) -> None:
    data = build([Member("deep/er/f", data=b"1"), Member("./top", data=b"2")])
    assert upload(sandbox, "/tmp", data) == (2, 2)
    assert (sandbox.root / "tmp/deep/er/f").read_bytes() == b"1"
    assert (sandbox.root / "tmp/top").read_bytes() == b"2"


def test_empty_stream_creates_destination(sandbox: Sandbox) -> None:
    assert run(sandbox.files.upload("/new/dest", chunks([]))) == (0, 0)
    assert (sandbox.root / "new/dest").is_dir()


def test_destination_is_a_file(sandbox: Sandbox) -> None:
    assert_refused(
        sandbox.files.upload("/etc/passwd", chunks([build([Member("f", data=b"x")])])),
        grpc.StatusCode.FAILED_PRECONDITION,
        "NOT_A_DIRECTORY",
    )


def test_replaces_files_and_symlinks_never_writes_through(sandbox: Sandbox) -> None:
    before = sandbox.host_snapshot()
    dest = sandbox.root / "tmp"
    (dest / "f").write_bytes(b"old")
    (dest / "l").symlink_to(sandbox.secret)
    (dest / "p").symlink_to("/etc/passwd")
    data = build([Member("f", data=b"new"), Member("l", data=b"L"), Member("p", data=b"P")])
    assert upload(sandbox, "/tmp", data) == (3, 5)
    assert [(dest / n).read_bytes() for n in "flp"] == [b"new", b"L", b"P"]
    assert not (dest / "l").is_symlink()
    assert (sandbox.root / "etc/passwd").read_bytes() == SANDBOX_PASSWD
    assert sandbox.host_snapshot() == before


def test_file_member_onto_directory(sandbox: Sandbox) -> None:
    (sandbox.root / "tmp/d").mkdir()
    assert_refused(
        sandbox.files.upload("/tmp", chunks([build([Member("d", data=b"x")])])),
        grpc.StatusCode.FAILED_PRECONDITION,
        "IS_A_DIRECTORY",
    )


@pytest.mark.parametrize("name", ["../x", "/abs", "a/../../x", "./../../../x"])
def test_member_names_escaping(sandbox: Sandbox, name: str) -> None:
    before = sandbox.host_snapshot()
    data = build([Member("ok", data=b"1"), Member(name, data=b"evil")])
    err = assert_refused(
        sandbox.files.upload("/tmp/dest", chunks([data])),
        grpc.StatusCode.INVALID_ARGUMENT,
        "PATH_ESCAPE",
    )
    assert repr(name) in err.message
    assert not (sandbox.root / "tmp/x").exists() and not (sandbox.root / "x").exists()
    assert not (sandbox.root / "abs").exists()
    assert sandbox.host_snapshot() == before


@pytest.mark.parametrize(
    ("name", "target"),
    [("l", "/etc"), ("l", ".."), ("a/l", "../../x"), ("l", "/tmp"), ("a/l", "b/../../..")],
)
def test_symlink_members_pointing_out(sandbox: Sandbox, name: str, target: str) -> None:
    err = assert_refused(
        sandbox.files.upload("/tmp/dest", chunks([build([Member(name, SYM, linkname=target)])])),
        grpc.StatusCode.INVALID_ARGUMENT,
        "PATH_ESCAPE",
    )
    assert "symlink" in err.message
    assert not os.path.lexists(sandbox.root / "tmp/dest" / name)


def test_symlink_member_then_file_through_it_stays_inside(sandbox: Sandbox) -> None:
    data = build(
        [
            Member("sub/", DIR),
            Member("alias", SYM, linkname="sub"),
            Member("alias/f", data=b"through"),
        ]
    )
    assert upload(sandbox, "/tmp/dest", data) == (2, 7)
    assert (sandbox.root / "tmp/dest/sub/f").read_bytes() == b"through"


def test_planted_symlinks_cannot_redirect_members(sandbox: Sandbox) -> None:
    """The sandbox plants links in the destination before the client uploads."""
    before = sandbox.host_snapshot()
    dest = sandbox.root / "home/agent/up"
    dest.mkdir()
    (dest / "etc").symlink_to("/etc")  # absolute, in-root: the sandbox's /etc
    (dest / "host").symlink_to(sandbox.host)
    (dest / "climb").symlink_to("../..")
    for member in ("etc/passwd", "host/secret", "climb/etc/passwd", "climb/x"):
        assert_refused(
            sandbox.files.upload("/home/agent/up", chunks([build([Member(member, data=b"E")])])),
            grpc.StatusCode.INVALID_ARGUMENT,
            "PATH_ESCAPE",
        )
    assert (sandbox.root / "etc/passwd").read_bytes() == SANDBOX_PASSWD
    assert not (sandbox.root / "home/x").exists()
    assert sandbox.host_snapshot() == before


@pytest.mark.parametrize("target", ["../outside", "/etc/passwd", "a/../../x"])
def test_hard_links_out_of_destination(sandbox: Sandbox, target: str) -> None:
    err = assert_refused(
        sandbox.files.upload("/tmp/dest", chunks([build([Member("h", LNK, linkname=target)])])),
        grpc.StatusCode.INVALID_ARGUMENT,
        "PATH_ESCAPE",
    )
    assert "hard link" in err.message
    assert not os.path.lexists(sandbox.root / "tmp/dest/h")


def test_hard_link_through_planted_symlink(sandbox: Sandbox) -> None:
    dest = sandbox.root / "tmp/dest"
    dest.mkdir()
    (dest / "etc").symlink_to("/etc")
    assert_refused(
        sandbox.files.upload(
            "/tmp/dest", chunks([build([Member("h", LNK, linkname="etc/passwd")])])
        ),
        grpc.StatusCode.INVALID_ARGUMENT,
        "PATH_ESCAPE",
    )
    assert (sandbox.root / "etc/passwd").stat().st_nlink == 1


def test_hard_link_to_missing_target(sandbox: Sandbox) -> None:
    assert_refused(
        sandbox.files.upload("/tmp", chunks([build([Member("h", LNK, linkname="nope")])])),
        grpc.StatusCode.NOT_FOUND,
        "PATH_NOT_FOUND",
    )


@pytest.mark.parametrize("kind", [tarfile.CHRTYPE, tarfile.BLKTYPE, tarfile.FIFOTYPE])
def test_device_and_fifo_members(sandbox: Sandbox, kind: bytes) -> None:
    err = assert_refused(
        sandbox.files.upload("/tmp", chunks([build([Member("dev", kind)])])),
        grpc.StatusCode.FAILED_PRECONDITION,
        "UNSUPPORTED_FILE_TYPE",
    )
    assert "'dev'" in err.message
    assert not os.path.lexists(sandbox.root / "tmp/dev")


def test_truncated_stream_leaves_no_partial_file(sandbox: Sandbox) -> None:
    data = build([Member("big", data=os.urandom(300_000))])
    assert_refused(
        sandbox.files.upload("/tmp", chunks(split(data[:150_000]))),
        grpc.StatusCode.INVALID_ARGUMENT,
        "INVALID_FIELD",
    )
    assert not os.path.lexists(sandbox.root / "tmp/big")


def test_header_size_is_not_trusted(sandbox: Sandbox) -> None:
    """A header claiming 1 TiB on a short stream: refused, nothing allocated for it."""
    fake = tarfile.TarInfo("f")
    fake.size = 1 << 40
    header = fake.tobuf(tarfile.GNU_FORMAT)
    stream = header + b"x" * 1024
    assert_refused(
        sandbox.files.upload("/tmp", chunks([stream])),
        grpc.StatusCode.INVALID_ARGUMENT,
        "INVALID_FIELD",
    )
    assert not os.path.lexists(sandbox.root / "tmp/f")


def test_huge_pax_header_is_refused(sandbox: Sandbox) -> None:
    data = build([Member("f", data=b"x", extra={"comment": "c" * (2 << 20)})])
    assert_refused(
        sandbox.files.upload("/tmp", chunks(split(data))),
        grpc.StatusCode.INVALID_ARGUMENT,
        "INVALID_FIELD",
    )


def test_garbage_is_refused(sandbox: Sandbox) -> None:
    assert_refused(
        sandbox.files.upload("/tmp", chunks([b"this is not a tar archive" * 100])),
        grpc.StatusCode.INVALID_ARGUMENT,
        "INVALID_FIELD",
    )


def test_tar_bomb_of_tiny_members_streams(sandbox: Sandbox) -> None:
    """20k members arrive in 64 KiB chunks; memory does not grow with the member count."""
    count = 20_000
    one = build([Member("d/f00000", data=b"x")])[:1024]  # header + one data block

    def member(i: int) -> bytes:
        info = tarfile.TarInfo(f"d/f{i:05d}")
        info.size = 1
        return info.tobuf(tarfile.USTAR_FORMAT) + b"x" + b"\0" * 511

    assert len(one) == len(member(0))

    async def stream() -> AsyncIterator[bytes]:
        buf = bytearray()
        for i in range(count):
            buf += member(i)
            if len(buf) >= 65536:
                yield bytes(buf)
                buf.clear()
        yield bytes(buf) + b"\0" * 1024

    tracemalloc.start()
    try:
        result = run(sandbox.files.upload("/tmp/bomb", stream()))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert result == (count, count)
    assert len(os.listdir(sandbox.root / "tmp/bomb/d")) == count
    assert peak < 8 << 20, f"peak {peak / 2**20:.1f} MiB for {count} members"


def test_gzip_bomb_is_decompressed_in_bounded_steps() -> None:
    bomb = zlib.compressobj(9, zlib.DEFLATED, 31)
    compressed = bomb.compress(b"\0" * (256 << 20)) + bomb.flush()
    assert len(compressed) < 1 << 20
    parts = iter([compressed])

    class Source:
        def read(self, size: int = -1, /) -> bytes:
            return next(parts, b"")

    tracemalloc.start()
    try:
        stream = open_decoded(Source())
        assert stream is not None
        first = stream.read(1 << 20)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert first == b"\0" * (1 << 20)
    assert peak < 8 << 20


def test_upload_into_symlinked_destination_resolves_in_root(sandbox: Sandbox) -> None:
    before = sandbox.host_snapshot()
    (sandbox.root / "tmp/to-host").symlink_to(sandbox.host)
    mirror = sandbox.root / str(sandbox.host).lstrip("/")
    mirror.mkdir(parents=True)
    assert upload(sandbox, "/tmp/to-host", build([Member("secret", data=b"S")])) == (1, 1)
    assert (mirror / "secret").read_bytes() == b"S"
    assert sandbox.secret.read_bytes() == HOST_SECRET
    assert sandbox.host_snapshot() == before
