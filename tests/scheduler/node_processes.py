"""Real node services as child processes for the restart tests (started and stopped by pid).

Unlike ``orchard up`` (which stops the whole stack when one child dies), these
let a test kill -9 the scheduler alone and start a new one on the same home
and port while the executor and the sandboxes stay up.
"""

from __future__ import annotations

import os
import select
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import grpc

from orchard._proto.orchard.v1 import executor_pb2, executor_pb2_grpc, sandbox_pb2


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@dataclass
class Service:
    name: str
    process: subprocess.Popen[bytes]
    address: str

    def kill9(self) -> None:
        os.kill(self.process.pid, signal.SIGKILL)
        self.process.wait(10)
        if self.process.stdout is not None:
            self.process.stdout.close()

    def stop(self, timeout: float = 90) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        if self.process.stdout is not None:
            self.process.stdout.close()
        return self.process.returncode


def start_service(name: str, module: str, args: list[str], home: Path) -> Service:
    logs = home / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    with open(logs / f"{name}.log", "ab") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", module, "--home", str(home), *args],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=log,
            env={**os.environ, "ORCHARD_HOME": str(home), "PYTHONUNBUFFERED": "1"},
        )
    assert process.stdout is not None
    deadline = time.monotonic() + 60
    buffer = b""
    while b"\n" not in buffer and time.monotonic() < deadline:
        ready, _, _ = select.select([process.stdout], [], [], 0.5)
        if ready:
            data = os.read(process.stdout.fileno(), 4096)
            if not data:
                break
            buffer += data
    if b"\n" not in buffer:
        process.kill()
        process.wait()
        raise AssertionError(f"{name} did not start; see {logs / (name + '.log')}")
    return Service(name, process, buffer.split(b"\n", 1)[0].decode().strip())


def start_local_scheduler(home: Path, port: int, executor: Service) -> Service:
    """A scheduler on the local (runc) backend, talking to ``executor``, on ``port``."""
    from orchard.executor.initbin import ensure_init_binary

    images = os.environ.get("ORCHARD_IMAGES_DIR") or "/var/lib/orchard/images"
    return start_service(
        "scheduler", "orchard.scheduler",
        ["--listen", f"127.0.0.1:{port}", "--executor-address", executor.address,
         "--backend", "local", "--images-dir", images,
         "--init-binary", str(ensure_init_binary(home)), "--delete-all-on-shutdown"],
        home,
    )  # fmt: skip


def as_gateway(home: Path, scheduler_address: str) -> grpc.Channel:
    """A channel to the scheduler of ``home`` as the gateway (the one caller it admits:
    mutual TLS with the gateway's internal certificate)."""
    from orchard.common.internal_pki import InternalPKI

    return InternalPKI.of_home(home).identity("gateway").channel("scheduler", scheduler_address)


def run_in(
    executor_address: str,
    sb: sandbox_pb2.Sandbox | sandbox_pb2.ExecutorAccess,
    sandbox_id: str,
    argv: list[str],
) -> executor_pb2.RunResponse:
    """Run ``argv`` in a sandbox through the node executor with the scheduler's token."""
    access = sb.executor if isinstance(sb, sandbox_pb2.Sandbox) else sb
    with grpc.insecure_channel(executor_address) as channel:
        stub = executor_pb2_grpc.ExecutorServiceStub(channel)
        response: executor_pb2.RunResponse = stub.Run(
            executor_pb2.RunRequest(
                start=executor_pb2.ExecStart(sandbox_id=sandbox_id, argv=argv, timeout_seconds=10)
            ),
            metadata=(("authorization", f"Bearer {access.token}"),),
            timeout=30,
        )
        return response
