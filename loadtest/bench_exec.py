"""Exec micro-benchmark: latency of Run and SessionRun, and concurrent throughput.

Sets up a throwaway node (a temp home, one sandbox whose orchard-init runs as a
host process, a real ``python -m orchard.executor`` on a free port), then
prints one JSON object:

- ``run``: p50/p99 (ms) of N sequential ``Run(true)`` calls through a sync
  gRPC client, after warm-up;
- ``session``: the same for ``SessionRun("true")`` in one persistent shell;
- ``throughput``: exec/s with 64 concurrent ``Run(true)`` calls (grpc.aio
  client on uvloop) into the same sandbox.

    .venv/bin/python loadtest/bench_exec.py [--n 1000] [--concurrency 64] [--seconds 5]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import grpc
import uvloop
from orchard.executor.initbin import ensure_init_binary

from orchard._proto.orchard.v1 import executor_pb2 as pb
from orchard._proto.orchard.v1 import executor_pb2_grpc as pb_grpc
from orchard.common.layout import NodeLayout, SandboxMeta
from orchard.common.tokens import TokenSigner, load_or_create_key

SANDBOX_ID = "sb-bench"
PATH = "/usr/local/bin:/usr/bin:/bin"


def percentiles(samples: list[float]) -> dict[str, float]:
    ordered = sorted(samples)

    def pick(q: float) -> float:
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))]

    return {
        "n": len(ordered),
        "p50_ms": round(pick(0.50) * 1e3, 3),
        "p99_ms": round(pick(0.99) * 1e3, 3),
        "mean_ms": round(statistics.fmean(ordered) * 1e3, 3),
    }


def start_sandbox(home: Path, init_binary: Path) -> subprocess.Popen[bytes]:
    layout = NodeLayout(home).sandbox(SANDBOX_ID)
    layout.rootfs.mkdir(parents=True)
    SandboxMeta(sandbox_id=SANDBOX_ID, env={"PATH": PATH, "HOME": "/root"}).write(layout.meta_file)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(layout.init_socket))
    listener.listen(1024)
    fd = listener.fileno()
    proc = subprocess.Popen([str(init_binary), "--listen-fd", str(fd)], pass_fds=[fd])
    listener.close()
    return proc


def start_executor(home: Path) -> tuple[subprocess.Popen[bytes], str]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "orchard.executor", "--home", str(home), "--listen", "127.0.0.1:0"],
        stdout=subprocess.PIPE,
        stderr=open(home / "executor.log", "ab"),  # noqa: SIM115 - the child keeps it
    )
    assert proc.stdout is not None
    return proc, proc.stdout.readline().decode().strip()


def bench_run(
    stub: pb_grpc.ExecutorServiceStub, metadata: tuple[tuple[str, str], ...], n: int
) -> dict[str, float]:
    request = pb.RunRequest(start=pb.ExecStart(sandbox_id=SANDBOX_ID, argv=["true"]))
    for _ in range(max(100, n // 10)):
        stub.Run(request, metadata=metadata)
    samples = []
    for _ in range(n):
        t = time.perf_counter()
        response = stub.Run(request, metadata=metadata)
        samples.append(time.perf_counter() - t)
        assert response.status.exit_code == 0
    return percentiles(samples)


def bench_session(
    stub: pb_grpc.ExecutorServiceStub, metadata: tuple[tuple[str, str], ...], n: int
) -> dict[str, float]:
    session = stub.CreateSession(pb.CreateSessionRequest(sandbox_id=SANDBOX_ID), metadata=metadata)
    request = pb.SessionRunRequest(
        sandbox_id=SANDBOX_ID, session_id=session.session_id, command="true"
    )
    for _ in range(50):
        stub.SessionRun(request, metadata=metadata)
    samples = []
    for _ in range(n):
        t = time.perf_counter()
        response = stub.SessionRun(request, metadata=metadata)
        samples.append(time.perf_counter() - t)
        assert response.status.exit_code == 0
    stub.CloseSession(
        pb.SessionRef(sandbox_id=SANDBOX_ID, session_id=session.session_id), metadata=metadata
    )
    return percentiles(samples)


async def bench_throughput(
    address: str, metadata: tuple[tuple[str, str], ...], concurrency: int, seconds: float
) -> dict[str, float]:
    request = pb.RunRequest(start=pb.ExecStart(sandbox_id=SANDBOX_ID, argv=["true"]))
    async with grpc.aio.insecure_channel(address) as channel:
        stub = pb_grpc.ExecutorServiceStub(channel)  # type: ignore[no-untyped-call]
        done = 0
        failures = 0
        stop_at = 0.0

        async def worker() -> None:
            nonlocal done, failures
            while time.perf_counter() < stop_at:
                response = await stub.Run(request, metadata=metadata)
                if response.status.exit_code == 0:
                    done += 1
                else:
                    failures += 1

        stop_at = time.perf_counter() + 1.0  # warm-up
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        done = failures = 0
        started = time.perf_counter()
        stop_at = started + seconds
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        elapsed = time.perf_counter() - started
    return {
        "concurrency": concurrency,
        "execs": done,
        "failures": failures,
        "exec_per_s": round(done / elapsed, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--n", type=int, default=1000)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--seconds", type=float, default=5.0)
    args = parser.parse_args()

    home = Path(tempfile.mkdtemp(prefix="oe-bench-", dir="/tmp"))
    init = executor = None
    try:
        init = start_sandbox(home, ensure_init_binary(home))
        executor, address = start_executor(home)
        signer = TokenSigner(load_or_create_key(NodeLayout(home).token_key))
        token, _ = signer.issue(SANDBOX_ID, 3600)
        metadata = (("authorization", f"Bearer {token}"),)
        with grpc.insecure_channel(address) as channel:
            stub = pb_grpc.ExecutorServiceStub(channel)  # type: ignore[no-untyped-call]
            run = bench_run(stub, metadata, args.n)
            session = bench_session(stub, metadata, args.n)
        throughput = uvloop.run(bench_throughput(address, metadata, args.concurrency, args.seconds))
        print(json.dumps({"run": run, "session": session, "throughput": throughput}, indent=2))
    except BaseException:
        log = home / "executor.log"
        if log.exists():
            print(log.read_text()[-3000:], file=sys.stderr)
        raise
    finally:
        for proc in (executor, init):
            if proc is not None and proc.poll() is None:
                proc.send_signal(signal.SIGTERM if proc is executor else signal.SIGKILL)
                proc.wait(10)
        shutil.rmtree(home, ignore_errors=True)


if __name__ == "__main__":
    main()
