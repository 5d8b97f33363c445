"""File-transfer benchmark: one big file each way and a many-file tree each way.

Two levels, one JSON object printed:

- ``functions``: :class:`orchard.executor.files.SandboxFiles` called in-process
  (what the executor's own code costs);
- ``grpc``: the same through a real ``python -m orchard.executor`` on a free
  port (a throwaway node home with one sandbox whose rootfs is a plain
  directory; file calls need no running init), with a grpc.aio client.

Figures: ``write_MBps`` / ``read_MBps`` for a ``--file-mib`` file (WriteFile /
ReadFile), ``upload_files_per_s`` / ``download_files_per_s`` for a tree of
``--files`` files of ``--file-bytes`` each in 100 directories (Upload /
Download). The upload's tar is built before the clock starts (client-side
cost excluded); the download is consumed as raw chunks. Each figure is the
best of ``--repeat`` runs (the machine is shared; the best is the least
disturbed), with the median next to it.

    .venv/bin/python loadtest/bench_files.py [--dir /dev/shm] [--file-mib 256] [--files 10000]

``--dir`` picks the filesystem the sandbox root lives on: the file service's
own cost shows on tmpfs; on a disk the filesystem's create cost adds to it.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import grpc
import uvloop
from orchard.executor.files import SandboxFiles

from orchard._proto.orchard.v1 import executor_pb2 as pb
from orchard._proto.orchard.v1 import executor_pb2_grpc as pb_grpc
from orchard.common.layout import NodeLayout, SandboxMeta
from orchard.common.tokens import TokenSigner, load_or_create_key

SANDBOX_ID = "sb-files-bench"
CHUNK = 1 << 20
MB = 1e6


def build_tree_tar(files: int, size: int) -> bytes:
    body = os.urandom(size)
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for d in range(100):
            info = tarfile.TarInfo(f"tree/d{d:03d}")
            info.type = tarfile.DIRTYPE
            info.mode = 0o755
            tar.addfile(info)
        for i in range(files):
            info = tarfile.TarInfo(f"tree/d{i % 100:03d}/f{i:06d}.txt")
            info.size = size
            tar.addfile(info, io.BytesIO(body))
    return buf.getvalue()


def split(data: bytes) -> list[bytes]:
    return [data[i : i + CHUNK] for i in range(0, len(data), CHUNK)]


def summary(samples: list[float], unit: float, count: float) -> dict[str, float]:
    """Best and median rate (count / unit per second) over timed runs."""
    rates = [count / unit / s for s in samples]
    return {"best": round(max(rates), 1), "median": round(statistics.median(rates), 1)}


async def timed(repeat: int, fn: Callable[[int], Awaitable[None]]) -> list[float]:
    samples = []
    for i in range(repeat):
        start = time.perf_counter()
        await fn(i)
        samples.append(time.perf_counter() - start)
    return samples


# -- in-process ------------------------------------------------------------------


async def bench_functions(root: Path, args: argparse.Namespace, tree: bytes) -> dict[str, object]:
    files = SandboxFiles(root)
    size = args.file_mib << 20
    block = os.urandom(CHUNK)

    async def source() -> AsyncIterator[bytes]:
        for _ in range(size // CHUNK):
            yield block

    async def write(i: int) -> None:
        assert await files.write_file(f"/big{i}", 0, False, source()) == size

    async def read(i: int) -> None:
        total = 0
        async for chunk in files.read_file(f"/big{i}"):
            total += len(chunk.data)
        assert total == size

    tree_chunks = split(tree)

    async def tree_source() -> AsyncIterator[bytes]:
        for chunk in tree_chunks:
            yield chunk

    async def upload(i: int) -> None:
        count, _ = await files.upload(f"/up{i}", tree_source())
        assert count == args.files

    async def download(i: int) -> None:
        async for _ in files.download(f"/up{i}/tree"):
            pass

    w = await timed(args.repeat, write)
    r = await timed(args.repeat, read)
    u = await timed(args.repeat, upload)
    d = await timed(args.repeat, download)
    return {
        "write_MBps": summary(w, MB, size),
        "read_MBps": summary(r, MB, size),
        "upload_files_per_s": summary(u, 1, args.files),
        "download_files_per_s": summary(d, 1, args.files),
    }


# -- through gRPC ------------------------------------------------------------------


def start_node(home: Path) -> tuple[subprocess.Popen[bytes], str, tuple[tuple[str, str], ...]]:
    layout = NodeLayout(home).sandbox(SANDBOX_ID)
    layout.rootfs.mkdir(parents=True)
    SandboxMeta(sandbox_id=SANDBOX_ID).write(layout.meta_file)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)  # only has to exist
    listener.bind(str(layout.init_socket))
    listener.close()
    signer = TokenSigner(load_or_create_key(NodeLayout(home).token_key))
    token, _ = signer.issue(SANDBOX_ID, 3600)
    proc = subprocess.Popen(
        [sys.executable, "-m", "orchard.executor", "--home", str(home), "--listen", "127.0.0.1:0"],
        stdout=subprocess.PIPE,
        stderr=open(home / "executor.log", "ab"),  # noqa: SIM115 - the child keeps it
    )
    assert proc.stdout is not None
    address = proc.stdout.readline().decode().strip()
    if not address:
        raise RuntimeError(f"executor did not start; see {home / 'executor.log'}")
    return proc, address, (("authorization", f"Bearer {token}"),)


async def bench_grpc(
    address: str, metadata: tuple[tuple[str, str], ...], args: argparse.Namespace, tree: bytes
) -> dict[str, object]:
    size = args.file_mib << 20
    block = os.urandom(CHUNK)
    options = [("grpc.max_receive_message_length", 64 << 20)]
    async with grpc.aio.insecure_channel(address, options=options) as channel:
        stub = pb_grpc.ExecutorServiceStub(channel)  # type: ignore[no-untyped-call]

        async def write(i: int) -> None:
            async def requests() -> AsyncIterator[pb.WriteFileRequest]:
                yield pb.WriteFileRequest(
                    header=pb.WriteFileHeader(sandbox_id=SANDBOX_ID, path=f"/big{i}")
                )
                for _ in range(size // CHUNK):
                    yield pb.WriteFileRequest(data=block)
                yield pb.WriteFileRequest(end=pb.WriteFileEnd(size=size // CHUNK * CHUNK))

            response = await stub.WriteFile(requests(), metadata=metadata)
            assert response.size == size

        async def read(i: int) -> None:
            total = 0
            call = stub.ReadFile(
                pb.ReadFileRequest(sandbox_id=SANDBOX_ID, path=f"/big{i}"), metadata=metadata
            )
            async for chunk in call:
                total += len(chunk.data)
            assert total == size

        tree_chunks = split(tree)

        async def upload(i: int) -> None:
            async def requests() -> AsyncIterator[pb.UploadRequest]:
                yield pb.UploadRequest(
                    header=pb.UploadHeader(sandbox_id=SANDBOX_ID, path=f"/up{i}")
                )
                for chunk in tree_chunks:
                    yield pb.UploadRequest(data=chunk)

            response = await stub.Upload(requests(), metadata=metadata)
            assert response.files == args.files

        async def download(i: int) -> None:
            call = stub.Download(
                pb.DownloadRequest(sandbox_id=SANDBOX_ID, path=f"/up{i}/tree"), metadata=metadata
            )
            async for _ in call:
                pass

        w = await timed(args.repeat, write)
        r = await timed(args.repeat, read)
        u = await timed(args.repeat, upload)
        d = await timed(args.repeat, download)
    return {
        "write_MBps": summary(w, MB, size),
        "read_MBps": summary(r, MB, size),
        "upload_files_per_s": summary(u, 1, args.files),
        "download_files_per_s": summary(d, 1, args.files),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", default=tempfile.gettempdir(), help="where the node home goes")
    parser.add_argument("--file-mib", type=int, default=256)
    parser.add_argument("--files", type=int, default=10_000)
    parser.add_argument("--file-bytes", type=int, default=1024)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--skip-grpc", action="store_true")
    args = parser.parse_args()

    tree = build_tree_tar(args.files, args.file_bytes)
    home = Path(tempfile.mkdtemp(prefix="orchard-bench-files-", dir=args.dir))
    result: dict[str, object] = {
        "dir": args.dir,
        "file_mib": args.file_mib,
        "tree": {"files": args.files, "file_bytes": args.file_bytes, "dirs": 100},
        "cpus": os.cpu_count(),
        "loadavg_before": os.getloadavg()[0],
    }
    try:
        fn_root = home / "fn-root"
        fn_root.mkdir()
        result["functions"] = uvloop.run(bench_functions(fn_root, args, tree))
        shutil.rmtree(fn_root)
        if not args.skip_grpc:
            proc, address, metadata = start_node(home / "node")
            try:
                result["grpc"] = uvloop.run(bench_grpc(address, metadata, args, tree))
            finally:
                proc.terminate()
                proc.wait(10)
    finally:
        shutil.rmtree(home, ignore_errors=True)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()


# -- through the SDK, on a real sandbox ----------------------------------------------


def make_local_tree(root: Path, files: int, size: int) -> None:
    """``files`` files of ``size`` bytes in 100 directories under ``root``."""
    body = os.urandom(size)
    for d in range(100):
        (root / f"d{d:03d}").mkdir(parents=True, exist_ok=True)
    for i in range(files):
        (root / f"d{i % 100:03d}" / f"f{i:06d}.txt").write_bytes(body)


def sdk_figures(
    sb: Any, file_mib: int = 256, files: int = 10_000, file_bytes: int = 1024, repeat: int = 3
) -> dict[str, object]:
    """WriteFile/ReadFile of one big file and Upload/Download of a tree, through the public SDK.

    The local side lives in /dev/shm, so the figures are the SDK, the wire, the
    executor and the sandbox's filesystem, not this machine's local disk.
    ``sb`` is an :class:`orchard.Sandbox` (sync).
    """
    size = file_mib << 20
    block = os.urandom(CHUNK)
    local = Path(tempfile.mkdtemp(prefix="orchard-bench-files-sdk-", dir="/dev/shm"))
    try:
        tree = local / "tree"
        make_local_tree(tree, files, file_bytes)
        w, r, u, d = [], [], [], []
        for i in range(repeat):
            payload = io.BufferedReader(_Repeat(block, size))  # type: ignore[arg-type]
            t0 = time.perf_counter()
            sb.write_file(f"/tmp/big{i}", payload)
            w.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            got = sum(len(c) for c in sb.iter_file(f"/tmp/big{i}"))
            r.append(time.perf_counter() - t0)
            assert got == size, got
            sb.exec(["rm", "-f", f"/tmp/big{i}"])
            t0 = time.perf_counter()
            count, _ = sb.upload(tree, f"/tmp/up{i}")
            u.append(time.perf_counter() - t0)
            assert count >= files, count
            back = local / f"back{i}"
            t0 = time.perf_counter()
            sb.download(f"/tmp/up{i}", back)
            d.append(time.perf_counter() - t0)
            shutil.rmtree(back)
            sb.exec(["rm", "-rf", f"/tmp/up{i}"])
        return {
            "write_MBps": summary(w, MB, size),
            "read_MBps": summary(r, MB, size),
            "upload_files_per_s": summary(u, 1, files),
            "download_files_per_s": summary(d, 1, files),
            "file_mib": file_mib,
            "tree_files": files,
            "repeat": repeat,
        }
    finally:
        shutil.rmtree(local, ignore_errors=True)


class _Repeat(io.RawIOBase):
    """A readable of ``total`` bytes made of one block repeated (no 256 MiB buffer)."""

    def __init__(self, block: bytes, total: int) -> None:
        self.block = block
        self.left = total

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        n = min(len(buffer), self.left, len(self.block))
        buffer[:n] = self.block[:n]
        self.left -= n
        return n
