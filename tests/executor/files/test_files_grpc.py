"""The file RPCs through a real executor process: wiring, statuses and reasons.

Uses the executor tests' harness (a real ``python -m orchard.executor``); the
sandbox needs no running init for file calls, only its folder and socket path.
"""

from __future__ import annotations

import os
import shutil
import socket
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import pytest

from orchard._proto.orchard.v1 import executor_pb2 as pb
from orchard.common.layout import NodeLayout, SandboxMeta

from ..harness import Client, ExecutorProcess, error_reason
from .tarbuild import Member, build, contents, split

SANDBOX_ID = "sb-files-grpc"


@pytest.fixture(scope="module")
def node() -> Iterator[tuple[Client, Path]]:
    home = Path(tempfile.mkdtemp(prefix="oe-files-", dir="/tmp"))
    layout = NodeLayout(home).sandbox(SANDBOX_ID)
    (layout.rootfs / "etc").mkdir(parents=True)
    (layout.rootfs / "etc/passwd").write_text("root:x:0:0::/root:/bin/sh\n")
    SandboxMeta(sandbox_id=SANDBOX_ID).write(layout.meta_file)
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(layout.init_socket))
    sock.close()
    executor = ExecutorProcess.start(home)
    client = Client(executor.address, home)
    try:
        yield client, layout.rootfs
    finally:
        client.close()
        executor.stop()
        shutil.rmtree(home, ignore_errors=True)


def status(err: grpc.RpcError) -> tuple[grpc.StatusCode, str | None]:
    return err.code(), error_reason(err)  # type: ignore[attr-defined]


def write(client: Client, path: str, data: bytes, **header: object) -> pb.WriteFileResponse:
    def requests() -> Iterator[pb.WriteFileRequest]:
        yield pb.WriteFileRequest(
            header=pb.WriteFileHeader(sandbox_id=SANDBOX_ID, path=path, **header)  # type: ignore[arg-type]
        )
        for part in split(data, 1 << 20):
            yield pb.WriteFileRequest(data=part)
        yield pb.WriteFileRequest(end=pb.WriteFileEnd(size=len(data)))

    response: pb.WriteFileResponse = client.stub.WriteFile(
        requests(), metadata=client.metadata(SANDBOX_ID), timeout=30
    )
    return response


def read(client: Client, path: str) -> list[pb.FileChunk]:
    return list(
        client.stub.ReadFile(
            pb.ReadFileRequest(sandbox_id=SANDBOX_ID, path=path),
            metadata=client.metadata(SANDBOX_ID),
            timeout=30,
        )
    )


def test_write_read_round_trip(node: tuple[Client, Path]) -> None:
    client, rootfs = node
    data = os.urandom(3 << 20)
    assert write(client, "/work/data.bin", data, mode=0o600, make_parents=True).size == len(data)
    assert (rootfs / "work/data.bin").read_bytes() == data
    chunks = read(client, "/work/data.bin")
    assert (chunks[0].info.size, chunks[0].info.mode) == (len(data), 0o600)
    assert b"".join(c.data for c in chunks) == data


def test_refusals_carry_reasons(node: tuple[Client, Path]) -> None:
    client, rootfs = node
    os.mkfifo(rootfs / "fifo")
    cases: list[tuple[Callable[[], object], grpc.StatusCode, str]] = [
        (lambda: read(client, "../../etc/passwd"), grpc.StatusCode.INVALID_ARGUMENT, "PATH_ESCAPE"),
        (
            lambda: read(client, "/fifo"),
            grpc.StatusCode.FAILED_PRECONDITION,
            "UNSUPPORTED_FILE_TYPE",
        ),
        (lambda: read(client, "/missing"), grpc.StatusCode.NOT_FOUND, "PATH_NOT_FOUND"),
        (
            lambda: write(client, "/etc", b"x"),
            grpc.StatusCode.FAILED_PRECONDITION,
            "IS_A_DIRECTORY",
        ),
        (
            lambda: write(client, "/etc/passwd/x", b"x"),
            grpc.StatusCode.FAILED_PRECONDITION,
            "NOT_A_DIRECTORY",
        ),
    ]
    for call, code, reason in cases:
        with pytest.raises(grpc.RpcError) as info:
            call()
        assert status(info.value) == (code, reason), info.value
    assert sorted(os.listdir(rootfs)) == ["etc", "fifo", "work"]


def upload(client: Client, dest: str, data: bytes) -> pb.UploadResponse:
    def requests() -> Iterator[pb.UploadRequest]:
        yield pb.UploadRequest(header=pb.UploadHeader(sandbox_id=SANDBOX_ID, path=dest))
        for part in split(data, 1 << 20):
            yield pb.UploadRequest(data=part)

    response: pb.UploadResponse = client.stub.Upload(
        requests(), metadata=client.metadata(SANDBOX_ID), timeout=30
    )
    return response


def test_upload_download(node: tuple[Client, Path]) -> None:
    client, rootfs = node
    tar = build(
        [Member("pkg/", b"5"), Member("pkg/a.py", data=b"a = 1\n")]
        + [Member(f"pkg/m{i}", data=b"m" * i) for i in range(200)]
    )
    response = upload(client, "/srv", tar)
    assert (response.files, response.bytes) == (201, 6 + sum(range(200)))
    assert (rootfs / "srv/pkg/a.py").read_bytes() == b"a = 1\n"
    stream = client.stub.Download(
        pb.DownloadRequest(sandbox_id=SANDBOX_ID, path="/srv/pkg"),
        metadata=client.metadata(SANDBOX_ID),
        timeout=30,
    )
    files = contents(b"".join(chunk.data for chunk in stream))
    assert files["pkg/a.py"] == b"a = 1\n" and files["pkg/m199"] == b"m" * 199


def test_upload_escape_is_refused(node: tuple[Client, Path]) -> None:
    client, rootfs = node
    with pytest.raises(grpc.RpcError) as info:
        upload(client, "/srv2", build([Member("../escaped", data=b"x")]))
    assert status(info.value) == (grpc.StatusCode.INVALID_ARGUMENT, "PATH_ESCAPE")
    assert not (rootfs / "escaped").exists()


def test_file_operation_rpcs(node: tuple[Client, Path]) -> None:
    """ListDir, Stat, MakeDir, Rename, Remove through the real executor process: wired,
    authorised per sandbox, refusals with their reasons."""
    client, rootfs = node
    md = client.metadata(SANDBOX_ID)
    made = client.stub.MakeDir(
        pb.MakeDirRequest(sandbox_id=SANDBOX_ID, path="/ops/a/b", parents=True, mode=0o700),
        metadata=md,
    )
    assert made.created and (os.stat(rootfs / "ops/a/b").st_mode & 0o7777) == 0o700
    write(client, "/ops/a/f", b"12345")
    listing = client.stub.ListDir(
        pb.ListDirRequest(sandbox_id=SANDBOX_ID, path="/ops", depth=3), metadata=md
    )
    assert [(e.path, e.type) for e in listing.entries] == [
        ("/ops/a", pb.FILE_TYPE_DIRECTORY),
        ("/ops/a/b", pb.FILE_TYPE_DIRECTORY),
        ("/ops/a/f", pb.FILE_TYPE_FILE),
    ]
    assert not listing.truncated
    got = client.stub.Stat(pb.StatRequest(sandbox_id=SANDBOX_ID, path="/ops/a/f"), metadata=md)
    assert (got.size, got.mode) == (5, 0o644)
    client.stub.Rename(
        pb.RenameRequest(sandbox_id=SANDBOX_ID, source="/ops/a/f", destination="/ops/g"),
        metadata=md,
    )
    assert (rootfs / "ops/g").read_bytes() == b"12345"
    for call, code, reason in [
        (
            lambda: client.stub.Stat(
                pb.StatRequest(sandbox_id=SANDBOX_ID, path="/ops/a/f"), metadata=md
            ),
            grpc.StatusCode.NOT_FOUND,
            "PATH_NOT_FOUND",
        ),
        (
            lambda: client.stub.Remove(
                pb.RemoveRequest(sandbox_id=SANDBOX_ID, path="/ops"), metadata=md
            ),
            grpc.StatusCode.FAILED_PRECONDITION,
            "IS_A_DIRECTORY",
        ),
        (
            lambda: client.stub.ListDir(
                pb.ListDirRequest(sandbox_id=SANDBOX_ID, path="/../x"), metadata=md
            ),
            grpc.StatusCode.INVALID_ARGUMENT,
            "PATH_ESCAPE",
        ),
        (  # a token for another sandbox opens nothing here
            lambda: client.stub.Remove(
                pb.RemoveRequest(sandbox_id=SANDBOX_ID, path="/ops", recursive=True),
                metadata=client.metadata("sb-some-other"),
            ),
            grpc.StatusCode.UNAUTHENTICATED,
            "TOKEN_INVALID",
        ),
    ]:
        with pytest.raises(grpc.RpcError) as info:
            call()
        assert status(info.value) == (code, reason), info.value
    removed = client.stub.Remove(
        pb.RemoveRequest(sandbox_id=SANDBOX_ID, path="/ops", recursive=True), metadata=md
    )
    assert removed.removed == 4 and not (rootfs / "ops").exists()


def test_a_stream_cut_short_writes_nothing(node: tuple[Client, Path]) -> None:
    """grpc.aio gives a handler a client's cancel as the stream's end, so the end must be
    said: a stream that stops after its data (as a cancelled, crashed or dropped client's
    does), or whose `end` miscounts, leaves no file and no temporary behind; an old file
    under the name is kept whole."""
    client, rootfs = node
    header = pb.WriteFileRequest(header=pb.WriteFileHeader(sandbox_id=SANDBOX_ID, path="/cut"))
    part = pb.WriteFileRequest(data=b"half of it")
    cases = {
        "no end": [header, part],
        "miscounted end": [header, part, pb.WriteFileRequest(end=pb.WriteFileEnd(size=99))],
        "data after end": [header, pb.WriteFileRequest(end=pb.WriteFileEnd(size=0)), part],
    }
    for name, requests in cases.items():
        for existing in (None, b"the old contents"):
            if existing is None:
                (rootfs / "cut").unlink(missing_ok=True)
            else:
                (rootfs / "cut").write_bytes(existing)
            with pytest.raises(grpc.RpcError) as refused:
                client.stub.WriteFile(
                    iter(requests), metadata=client.metadata(SANDBOX_ID), timeout=30
                )
            assert status(refused.value) == (grpc.StatusCode.INVALID_ARGUMENT, "INVALID_FIELD")
            assert "nothing was written" in (refused.value.details() or ""), name
            if existing is None:
                assert not (rootfs / "cut").exists(), name
            else:
                assert (rootfs / "cut").read_bytes() == existing, name
            assert not [p for p in os.listdir(rootfs) if p.startswith(".orchard")], name
    assert write(client, "/cut", b"whole").size == 5
    assert (rootfs / "cut").read_bytes() == b"whole"
    (rootfs / "cut").unlink()
