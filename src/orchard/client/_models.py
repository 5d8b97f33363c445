"""What the SDK returns: small frozen dataclasses built from proto messages."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field
from typing import Literal

from orchard._proto.orchard.v1 import executor_pb2, sandbox_pb2
from orchard.common.exit_codes import returncode

from ._network import NetworkPolicy, network_from_proto

SandboxState = Literal["pending", "ready", "claimed", "deleting", "deleted", "failed", "unknown"]


@dataclass(frozen=True)
class ExecStatus:
    """How a command ended."""

    exit_code: int
    """Exit code; ``-N`` when signal N killed the command (``subprocess``'s ``returncode``)."""
    signal: int = 0
    """The signal that killed the command, 0 if it exited."""
    timed_out: bool = False
    oom_killed: bool = False
    truncated: bool = False
    """Some output was dropped past the output cap."""
    duration_seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and not self.timed_out


@dataclass(frozen=True)
class ExecResult:
    """A finished command. ``stdout``/``stderr`` are bytes; ``*_text`` decode them as UTF-8."""

    exit_code: int
    stdout: bytes
    stderr: bytes
    status: ExecStatus

    @property
    def stdout_text(self) -> str:
        return self.stdout.decode("utf-8", errors="replace")

    @property
    def stderr_text(self) -> str:
        return self.stderr.decode("utf-8", errors="replace")

    @property
    def ok(self) -> bool:
        return self.status.ok

    @property
    def timed_out(self) -> bool:
        return self.status.timed_out

    @property
    def signal(self) -> int:
        """The signal that killed the command (0 if it exited); ``exit_code`` is then ``-signal``."""
        return self.status.signal

    @property
    def returncode(self) -> int:
        """``exit_code`` under subprocess's name, for code written against ``CompletedProcess``."""
        return self.exit_code


@dataclass(frozen=True)
class OutputChunk:
    """Output from ``exec_stream`` as it comes."""

    stream: Literal["stdout", "stderr"]
    data: bytes


ExecEvent = OutputChunk | ExecStatus


@dataclass(frozen=True)
class ImageInfo:
    """An image sandboxes can be made from (:meth:`Images.list`)."""

    name: str
    size_bytes: int
    layers: int
    is_default: bool


@dataclass(frozen=True)
class SandboxInfo:
    """A sandbox as the control plane describes it."""

    id: str
    state: SandboxState
    image: str
    cpu: float
    """Cores."""
    memory_bytes: int
    pids: int
    state_reason: str = ""
    labels: dict[str, str] = field(default_factory=dict)
    created_at: dt.datetime | None = None
    expires_at: dt.datetime | None = None
    tenant: str = ""
    template: str = ""
    """The template it was claimed from ("" for a plain create)."""
    fault: str = ""
    """For "failed": "client", "task" or "infrastructure" (drop the rollout)."""
    network: NetworkPolicy = field(default_factory=NetworkPolicy)
    """The network policy in force."""
    env: dict[str, str] = field(default_factory=dict)
    """The create-time environment its commands get (over the image's)."""
    ttl_seconds: int = 0
    """Seconds one lease lasts (``keepalive()`` extends the expiry to now + this)."""
    executor_address: str = ""
    """The node executor serving its data plane ("" unless ready)."""
    model_endpoint: str = ""
    """The model endpoint's base URL *inside* the sandbox (``http://127.0.0.1:7711``; a
    harness calls ``<it>/s/<session credential>/v1/...``), "" when created without one."""
    executor_tls: bool = False
    """That executor speaks TLS."""
    token_expires_at: dt.datetime | None = None
    """When the data-plane token the answer carried expires (the token itself is not kept
    here: it is a credential, and the SDK refreshes it by itself)."""
    tool_layers: tuple[str, ...] = ()
    """The tools layers mounted into it (``create(tools=...)``)."""


_STATES: dict[int, SandboxState] = {
    sandbox_pb2.PENDING: "pending",
    sandbox_pb2.READY: "ready",
    sandbox_pb2.DELETING: "deleting",
    sandbox_pb2.DELETED: "deleted",
    sandbox_pb2.FAILED: "failed",
    sandbox_pb2.CLAIMED: "claimed",
}


def _time(ts: object) -> dt.datetime | None:
    seconds = getattr(ts, "seconds", 0)
    nanos = getattr(ts, "nanos", 0)
    if not seconds and not nanos:
        return None
    return dt.datetime.fromtimestamp(seconds + nanos / 1e9, tz=dt.UTC)


def _expiry(ts: object) -> dt.datetime | None:
    """A token's expiry; one past datetime's range (year 9999: a server that issues tokens
    that do not expire) is datetime.max, which is what it means, not an error."""
    try:
        return _time(ts)
    except (ValueError, OverflowError, OSError):
        return dt.datetime.max.replace(tzinfo=dt.UTC)


def sandbox_info(msg: sandbox_pb2.Sandbox) -> SandboxInfo:
    return SandboxInfo(
        id=msg.id,
        state=_STATES.get(msg.state, "unknown"),
        image=msg.image,
        cpu=msg.resources.cpu_millis / 1000,
        memory_bytes=msg.resources.memory_bytes,
        pids=msg.resources.pids,
        state_reason=msg.state_reason,
        labels=dict(msg.labels),
        created_at=_time(msg.created_at),
        expires_at=_time(msg.expires_at),
        tenant=msg.tenant,
        template=msg.template,
        fault=msg.fault,
        network=network_from_proto(msg.network),
        env=dict(msg.env),
        ttl_seconds=msg.ttl_seconds,
        executor_address=msg.executor.address,
        model_endpoint=msg.model_endpoint,
        executor_tls=msg.executor.tls,
        token_expires_at=_expiry(msg.executor.token_expires_at),
        tool_layers=tuple(msg.tool_layers),
    )


def image_info(msg: sandbox_pb2.Image) -> ImageInfo:
    return ImageInfo(
        name=msg.name, size_bytes=msg.size_bytes, layers=msg.layers, is_default=msg.is_default
    )


def exec_status(msg: executor_pb2.ExecStatus) -> ExecStatus:
    return ExecStatus(
        exit_code=returncode(msg.exit_code, msg.signal),  # also fixes older executors' -1
        signal=msg.signal,
        timed_out=msg.timed_out,
        oom_killed=msg.oom_killed,
        truncated=msg.truncated or msg.stdout_truncated or msg.stderr_truncated,
        duration_seconds=msg.duration_seconds,
    )


def exec_result(msg: executor_pb2.RunResponse) -> ExecResult:
    status = exec_status(msg.status)
    return ExecResult(
        exit_code=status.exit_code, stdout=msg.stdout, stderr=msg.stderr, status=status
    )


def exec_event(msg: executor_pb2.ExecEvent) -> ExecEvent | None:
    kind = msg.WhichOneof("kind")
    if kind == "stdout":
        return OutputChunk("stdout", msg.stdout)
    if kind == "stderr":
        return OutputChunk("stderr", msg.stderr)
    if kind == "exit":
        return exec_status(msg.exit)
    return None


@dataclass(frozen=True)
class TenantInfo:
    """The calling tenant's own view (``client.tenant()``): its quota and what it uses now."""

    tenant: str
    quota: dict[str, float]
    """max_sandboxes, max_cpu_millis, max_memory_bytes, create_rate, create_burst,
    max_execs; 0 means unlimited."""
    sandboxes: int
    """Sandboxes counted against the quota (pending, ready, claimed)."""
    cpu: float
    """Their cpu in cores."""
    memory_bytes: int
    server_version: str
    """The version of the orchard-env scheduler that answered."""


def tenant_info(msg: sandbox_pb2.TenantView) -> TenantInfo:
    q = msg.quota
    return TenantInfo(
        tenant=msg.tenant,
        quota={
            "max_sandboxes": q.max_sandboxes,
            "max_cpu_millis": q.max_cpu_millis,
            "max_memory_bytes": q.max_memory_bytes,
            "create_rate": q.create_rate,
            "create_burst": q.create_burst,
            "max_execs": q.max_execs,
        },
        sandboxes=msg.usage.sandboxes,
        cpu=msg.usage.cpu_millis / 1000,
        memory_bytes=msg.usage.memory_bytes,
        server_version=msg.server_version,
    )
