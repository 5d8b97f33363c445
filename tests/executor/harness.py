"""A node for the executor tests: real orchard-init processes and a real executor.

``HostSandbox`` lays out ``<home>/sandboxes/<id>/`` like the local backend
does (rootfs, sandbox.json, init.sock) and runs orchard-init as a plain host
process on the listening socket. ``ExecutorProcess`` runs
``python -m orchard.executor`` as a subprocess on a free port. Everything is
stopped by pid.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import grpc

from orchard._proto.orchard.v1 import executor_pb2 as pb
from orchard._proto.orchard.v1 import executor_pb2_grpc as pb_grpc
from orchard.common.layout import NodeLayout, SandboxMeta
from orchard.common.tokens import TokenSigner

PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
PASSWD = (
    "root:x:0:0:root:/root:/bin/bash\n"
    "alice:x:1000:1000:Alice:/home/alice:/bin/sh\n"
    "nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n"
)
GROUP = "root:x:0:\nalice:x:1000:\nstaff:x:50:alice\nnogroup:x:65534:\n"


@dataclass
class HostSandbox:
    """A sandbox folder whose orchard-init runs on the host (not in a container)."""

    sandbox_id: str
    layout_home: Path
    init_binary: Path
    env: dict[str, str] = field(default_factory=lambda: {"PATH": PATH, "HOME": "/root"})
    process: subprocess.Popen[bytes] | None = None

    @property
    def dir(self) -> Path:
        return NodeLayout(self.layout_home).sandbox(self.sandbox_id).dir

    def create(self, memory_cgroup: str = "") -> HostSandbox:
        layout = NodeLayout(self.layout_home).sandbox(self.sandbox_id)
        (layout.rootfs / "etc").mkdir(parents=True, exist_ok=True)
        (layout.rootfs / "etc" / "passwd").write_text(PASSWD)
        (layout.rootfs / "etc" / "group").write_text(GROUP)
        SandboxMeta(
            sandbox_id=self.sandbox_id,
            env=self.env,
            memory_cgroup=memory_cgroup,
            cwd="/",
        ).write(layout.meta_file)
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        if layout.init_socket.exists():
            layout.init_socket.unlink()
        listener.bind(str(layout.init_socket))
        listener.listen(1024)
        fd = listener.fileno()
        self.process = subprocess.Popen(
            [str(self.init_binary), "--listen-fd", str(fd)], pass_fds=[fd], close_fds=True
        )
        listener.close()
        return self

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait(10)


@dataclass
class ExecutorProcess:
    home: Path
    process: subprocess.Popen[bytes]
    address: str

    @classmethod
    def start(
        cls, home: Path, *extra_args: str, env: dict[str, str] | None = None
    ) -> ExecutorProcess:
        """``extra_args``: more executor flags (TLS); ``env``: extra environment (e.g. the
        executor's share settings)."""
        with open(home / "executor.log", "ab") as log:
            process = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "orchard.executor",
                    "--home",
                    str(home),
                    "--listen",
                    "127.0.0.1:0",
                    *extra_args,
                ],
                stdout=subprocess.PIPE,
                stderr=log,
                env={**os.environ, **(env or {})},
            )
        assert process.stdout is not None
        line = process.stdout.readline().decode().strip()
        if not line:
            process.kill()
            raise RuntimeError(f"executor did not start; see {home / 'executor.log'}")
        return cls(home, process, line)

    def stop(self) -> None:
        if self.process.stdout is not None:
            self.process.stdout.close()
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(5)


class Client:
    """The generated sync stub plus the sandbox's token."""

    def __init__(self, address: str, home: Path) -> None:
        self.channel = grpc.insecure_channel(
            address,
            options=[("grpc.max_receive_message_length", -1), ("grpc.max_send_message_length", -1)],
        )
        self.stub = pb_grpc.ExecutorServiceStub(self.channel)  # type: ignore[no-untyped-call]
        self.signer = TokenSigner(NodeLayout(home).keyring_file())

    def metadata(self, sandbox_id: str, token: str | None = None) -> tuple[tuple[str, str], ...]:
        if token is None:
            token, _ = self.signer.issue(sandbox_id, 3600)
        return (("authorization", f"Bearer {token}"),)

    def run(
        self, sandbox_id: str, *, stdin: bytes = b"", timeout: float = 30, **start: object
    ) -> pb.RunResponse:
        request = pb.RunRequest(start=pb.ExecStart(sandbox_id=sandbox_id, **start), stdin=stdin)  # type: ignore[arg-type]
        response: pb.RunResponse = self.stub.Run(
            request, metadata=self.metadata(sandbox_id), timeout=timeout
        )
        return response

    def close(self) -> None:
        self.channel.close()


def pid_alive(pid: int) -> bool:
    """True if ``pid`` exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False
    return state not in ("Z", "X")


def wait_gone(pids: list[int], timeout: float = 5.0) -> list[int]:
    """Wait until none of ``pids`` is alive; return those still alive."""
    deadline = time.monotonic() + timeout
    alive = [p for p in pids if pid_alive(p)]
    while alive and time.monotonic() < deadline:
        time.sleep(0.02)
        alive = [p for p in alive if pid_alive(p)]
    return alive


def error_reason(err: grpc.RpcError) -> str | None:
    for key, value in err.trailing_metadata() or ():  # type: ignore[attr-defined]
        if key == "orchard-reason":
            return str(value)
    return None


def kill_pids(pids: list[int]) -> None:
    """Clean-up after a failed test: SIGKILL exactly these pids (ours)."""
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
