"""What the sync and async faces share: state, metadata, token freshness, error edge.

``ClientCore`` is what ``Orchard`` and ``AsyncOrchard`` share (config, the API
key's metadata, where data-plane calls go); ``SandboxCore`` holds a sandbox's
id, its client and its executor access, and builds every request. The faces
add only the I/O (a sync or a grpc.aio call) on top. ``translate_errors`` is
the single edge where ``grpc.RpcError`` becomes an :class:`OrchardError`.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import grpc

from orchard._proto.orchard.v1 import executor_pb2, sandbox_pb2

from . import _requests
from ._config import ClientConfig
from ._errors import ConfigurationError, SandboxNotReadyError, from_rpc_error
from ._models import SandboxInfo, sandbox_info

Metadata = tuple[tuple[str, str], ...]

# Refresh the data-plane token this long before it expires, so a call in
# flight never carries a token that lapses on the way.
TOKEN_REFRESH_MARGIN_SECONDS = 60.0
# Added to a command's own timeout to get the call deadline: the executor
# enforces the command timeout and needs a moment to report it.
DEADLINE_GRACE_SECONDS = 30.0


@contextlib.contextmanager
def translate_errors() -> Iterator[None]:
    """Turn any grpc error raised inside into the SDK's exception tree."""
    try:
        yield
    except grpc.RpcError as exc:
        raise from_rpc_error(exc) from None


@dataclass(frozen=True)
class ExecutorAccess:
    address: str
    token: str
    expires_at: float

    @classmethod
    def from_proto(cls, msg: sandbox_pb2.ExecutorAccess) -> ExecutorAccess:
        return cls(
            msg.address, msg.token, msg.token_expires_at.seconds + msg.token_expires_at.nanos / 1e9
        )

    def fresh(self, now: float | None = None) -> bool:
        return (
            time.time() if now is None else now
        ) < self.expires_at - TOKEN_REFRESH_MARGIN_SECONDS

    @property
    def metadata(self) -> Metadata:
        return (("authorization", f"Bearer {self.token}"),)


def api_metadata(config: ClientConfig) -> Metadata:
    return (("authorization", f"Bearer {config.api_key}"),)


def call_deadline(timeout: float | None) -> float | None:
    return None if timeout is None else timeout + DEADLINE_GRACE_SECONDS


def resolve_config(
    endpoint: str | None,
    api_key: str | None,
    data_plane: str | None,
    tls: Any,
    transport: object | None,
    interceptors: Sequence[object],
) -> ClientConfig:
    """A client's configuration from its arguments (both faces' constructors)."""
    if transport is not None and interceptors:
        raise ConfigurationError(
            "interceptors: give them to the transport you pass (transport=...), not to the client"
        )
    return ClientConfig.resolve(
        endpoint, api_key, data_plane=data_plane, tls=tls, required=transport is None
    )


def channel_credentials(tls: Any) -> grpc.ChannelCredentials | None:
    """The channel credentials of the client's TLS settings (None: plaintext)."""
    return None if tls is None else tls.channel_credentials()  # type: ignore[no-any-return]


class ClientCore:
    """What both clients share, without I/O: configuration and the API key's metadata."""

    def __init__(self, config: ClientConfig) -> None:
        self.config = config
        self.api_metadata: Metadata = api_metadata(config)

    def data_plane_address(self, access: ExecutorAccess) -> str:
        """Where data-plane calls go: the node executor, or the gateway in proxy mode
        (it forwards them there, or the nginx proxy the config names; the token rides along
        either way)."""
        if self.config.proxied:
            return self.config.data_plane_endpoint or self.config.endpoint
        return access.address

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.config.endpoint or 'in-process'}>"


class SandboxCore:
    """A sandbox handle without I/O: ids, its client, access and request building."""

    client: Any  # Orchard or AsyncOrchard (each face narrows it)

    def __init__(self, msg: sandbox_pb2.Sandbox, client: Any) -> None:
        self.id = msg.id
        self.client = client
        self._info = sandbox_info(msg)
        self._access = ExecutorAccess.from_proto(msg.executor) if msg.HasField("executor") else None
        self._deleted = False

    @property
    def config(self) -> ClientConfig:
        """The configuration of the client this handle came from."""
        config: ClientConfig = self.client.config
        return config

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.id} {self._info.state}>"

    @property
    def last_info(self) -> SandboxInfo:
        """What the control plane last said about this sandbox (no call)."""
        return self._info

    def _remember(self, msg: sandbox_pb2.Sandbox) -> None:
        self._info = sandbox_info(msg)
        if msg.HasField("executor"):
            self._access = ExecutorAccess.from_proto(msg.executor)

    def _usable_access(self) -> ExecutorAccess | None:
        """Current access if still fresh, else None (the caller fetches a new one)."""
        if self._access is not None and self._access.fresh():
            return self._access
        return None

    def _set_access(self, msg: sandbox_pb2.ExecutorAccess) -> ExecutorAccess:
        if not msg.address:
            raise SandboxNotReadyError(
                f"sandbox {self.id} has no executor address", code="FAILED_PRECONDITION"
            )
        self._access = ExecutorAccess.from_proto(msg)
        return self._access

    # ---- requests (pure) ----------------------------------------------------

    def _get_request(self) -> sandbox_pb2.GetSandboxRequest:
        return sandbox_pb2.GetSandboxRequest(id=self.id)

    def _start(
        self,
        cmd: _requests.Command,
        timeout: float | None,
        cwd: str | None,
        env: Mapping[str, str] | None,
        user: str | None,
        stdin: bool = False,
        max_output_bytes: int | None = None,
    ) -> executor_pb2.ExecStart:
        return _requests.exec_start(
            self.id,
            cmd,
            timeout=timeout,
            cwd=cwd,
            env=env,
            user=user,
            stdin=stdin,
            max_output_bytes=max_output_bytes,
        )

    def _create_session_request(
        self, cwd: str | None, env: Mapping[str, str] | None, user: str | None
    ) -> executor_pb2.CreateSessionRequest:
        return executor_pb2.CreateSessionRequest(
            sandbox_id=self.id, cwd=cwd or "", env=dict(env or {}), user=user or ""
        )

    def _read_request(self, path: str) -> executor_pb2.ReadFileRequest:
        return executor_pb2.ReadFileRequest(
            sandbox_id=self.id, path=_requests.check_remote_path(path)
        )

    def _download_request(self, path: str) -> executor_pb2.DownloadRequest:
        return executor_pb2.DownloadRequest(
            sandbox_id=self.id, path=_requests.check_remote_path(path, "remote_dir")
        )


def session_run_request(
    sandbox_id: str, session_id: str, command: str, timeout: float | None
) -> executor_pb2.SessionRunRequest:
    return executor_pb2.SessionRunRequest(
        sandbox_id=sandbox_id,
        session_id=session_id,
        command=command,
        timeout_seconds=timeout or 0.0,
    )


def session_ref(sandbox_id: str, session_id: str) -> executor_pb2.SessionRef:
    return executor_pb2.SessionRef(sandbox_id=sandbox_id, session_id=session_id)
