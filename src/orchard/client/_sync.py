"""The synchronous face: ``Sandbox`` and ``Session`` over the sync gRPC channel.

Every method builds its request with the shared core, makes one call, and
parses the answer with the shared models; errors cross ``translate_errors``.
"""

from __future__ import annotations

import builtins
import contextlib
import os
import time
from collections.abc import Iterable, Iterator, Mapping
from types import TracebackType
from typing import Self

from orchard._proto.orchard.v1 import executor_pb2, executor_pb2_grpc, sandbox_pb2, sandbox_pb2_grpc

from . import _requests, _tar, _values
from ._channels import sync_stub
from ._config import ClientConfig
from ._core import (
    ExecutorAccess,
    SandboxCore,
    api_metadata,
    call_deadline,
    session_ref,
    session_run_request,
    translate_errors,
)
from ._errors import QuotaExceededError, SandboxNotFoundError
from ._models import (
    ExecEvent,
    ExecResult,
    ImageInfo,
    SandboxInfo,
    exec_event,
    exec_result,
    image_info,
    sandbox_info,
)
from ._network import NetworkPolicy
from ._quota_wait import QuotaWait


def _control(config: ClientConfig) -> sandbox_pb2_grpc.SandboxServiceStub:
    return sync_stub(config.endpoint, sandbox_pb2_grpc.SandboxServiceStub)


class Sandbox(SandboxCore):
    """A sandbox, driven synchronously. Make one with :meth:`create` or :meth:`connect`.

    Used as a context manager, it is deleted on exit.
    """

    # ---- control plane ------------------------------------------------------

    @classmethod
    def create(
        cls,
        image: str | None = None,
        cpu: _values.Cpu | None = None,
        memory: _values.Memory | None = None,
        network: str | NetworkPolicy | None = None,
        ttl: _values.Ttl | None = None,
        labels: Mapping[str, str] | None = None,
        env: Mapping[str, str] | None = None,
        endpoint: str | None = None,
        api_key: str | None = None,
        request_id: str | None = None,
        pids: int | None = None,
        timeout: float | None = 120.0,
        template: str | None = None,
        files: Mapping[str, _requests.FileData] | None = None,
        wait_for_quota: float = 0.0,
    ) -> Sandbox:
        """Create a sandbox and wait until it is READY.

        ``cpu`` is in cores (``0.5``, ``2``, or ``"500m"``); ``memory`` is bytes or a
        size string (``"512Mi"``, ``"1Gi"``); ``ttl`` is seconds until the server
        deletes it; ``network`` is ``"none"`` (default); ``pids`` caps processes and threads. Unset values take the
        server's defaults. A retried call with the same ``request_id`` returns the
        same sandbox.

        ``template`` claims a warm sandbox of that template (image, resources and
        network come from it; leave them unset); ``env``, ``labels``, ``ttl`` and
        ``files`` (path -> content, written before this returns) apply to the claim.

        ``wait_for_quota`` (seconds): when the tenant is over a quota, keep
        retrying that long, sleeping the server's ``retry-after`` between tries,
        before raising :class:`QuotaExceededError` (0: raise at once).
        """
        config = ClientConfig.resolve(endpoint, api_key)
        request = _requests.create_request(
            image, cpu, memory, network, ttl, labels, env, request_id, pids, template
        )
        quota_wait = QuotaWait(wait_for_quota)
        while True:
            try:
                with translate_errors():
                    msg = _control(config).CreateSandbox(
                        request, metadata=api_metadata(config), timeout=timeout
                    )
                break
            except QuotaExceededError as exc:
                delay = quota_wait.next_delay(exc)
                if delay is None:
                    raise
                time.sleep(delay)
        sandbox = cls(msg, config)
        if files:
            try:
                for path, data in files.items():
                    sandbox.write_file(path, data)
            except BaseException:
                with contextlib.suppress(Exception):
                    sandbox.delete()
                raise
        return sandbox

    @classmethod
    def connect(
        cls, sandbox_id: str, endpoint: str | None = None, api_key: str | None = None
    ) -> Sandbox:
        """A handle on an existing sandbox."""
        config = ClientConfig.resolve(endpoint, api_key)
        with translate_errors():
            msg = _control(config).GetSandbox(
                sandbox_pb2.GetSandboxRequest(id=sandbox_id), metadata=api_metadata(config)
            )
        return cls(msg, config)

    @staticmethod
    def list(
        labels: Mapping[str, str] | None = None,
        endpoint: str | None = None,
        api_key: str | None = None,
    ) -> builtins.list[SandboxInfo]:
        """The caller's sandboxes (not deleted), optionally only those carrying ``labels``."""
        config = ClientConfig.resolve(endpoint, api_key)
        with translate_errors():
            resp = _control(config).ListSandboxes(
                sandbox_pb2.ListSandboxesRequest(labels=dict(labels or {})),
                metadata=api_metadata(config),
            )
        return [sandbox_info(s) for s in resp.sandboxes]

    @staticmethod
    def images(endpoint: str | None = None, api_key: str | None = None) -> builtins.list[ImageInfo]:
        config = ClientConfig.resolve(endpoint, api_key)
        with translate_errors():
            resp = _control(config).ListImages(
                sandbox_pb2.ListImagesRequest(), metadata=api_metadata(config)
            )
        return [image_info(i) for i in resp.images]

    @staticmethod
    def delete_by_id(
        sandbox_id: str, endpoint: str | None = None, api_key: str | None = None
    ) -> None:
        config = ClientConfig.resolve(endpoint, api_key)
        with translate_errors():
            _control(config).DeleteSandbox(
                sandbox_pb2.DeleteSandboxRequest(id=sandbox_id), metadata=api_metadata(config)
            )

    def info(self) -> SandboxInfo:
        """The sandbox's current state from the control plane."""
        with translate_errors():
            msg = _control(self.config).GetSandbox(
                self._get_request(), metadata=api_metadata(self.config)
            )
        self._remember(msg)
        return self._info

    def set_network(
        self,
        network: str | NetworkPolicy,
        *,
        cidrs: Iterable[str] = (),
        ports: Iterable[int] = (),
        domains: Iterable[str] = (),
    ) -> SandboxInfo:
        """Replace the sandbox's network policy; in force when this returns.

        ``network`` is ``"none"``, ``"internet"``, ``"allowlist"`` (with ``cidrs``,
        ``ports``, ``domains``) or a :class:`NetworkPolicy`.
        """
        request = _requests.network_update_request(self.id, network, cidrs, ports, domains)
        with translate_errors():
            msg = _control(self.config).UpdateNetworkPolicy(
                request, metadata=api_metadata(self.config)
            )
        self._remember(msg)
        return self._info

    def keepalive(self, ttl: _values.Ttl | None = None) -> SandboxInfo:
        """Extend the lease: the sandbox now expires ``ttl`` seconds from now (default: its own ttl).

        Long jobs call this now and then (a heartbeat) instead of asking for a
        long ttl up front, so a crashed trainer's sandboxes are reaped soon.
        """
        with translate_errors():
            msg = _control(self.config).KeepAlive(
                _requests.keepalive_request(self.id, ttl), metadata=api_metadata(self.config)
            )
        self._remember(msg)
        return self._info

    def delete(self) -> None:
        """Delete the sandbox (waits until its container is gone). Deleting twice is fine."""
        self.delete_by_id(self.id, self.config.endpoint, self.config.api_key)
        self._deleted = True

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        if not self._deleted:
            with contextlib.suppress(SandboxNotFoundError):
                self.delete()

    # ---- data plane ---------------------------------------------------------

    def _executor(self) -> tuple[executor_pb2_grpc.ExecutorServiceStub, ExecutorAccess]:
        access = self._usable_access()
        if access is None:
            with translate_errors():
                msg = _control(self.config).GetExecutorAccess(
                    self._get_request(), metadata=api_metadata(self.config)
                )
            access = self._set_access(msg)
        address = self._data_plane_address(access)
        return sync_stub(address, executor_pb2_grpc.ExecutorServiceStub), access

    def exec(
        self,
        cmd: _requests.Command,
        timeout: float | None = None,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        stdin: _requests.Stdin = None,
        user: str | None = None,
        max_output_bytes: int | None = None,
    ) -> ExecResult:
        """Run a command and wait for it; a str runs via ``/bin/sh -c``, a list as argv.

        A non-zero exit or a timeout is a result (``exit_code``, ``timed_out``), not an
        exception. Output is returned whole, each stream capped at ``max_output_bytes``
        (the server's default, 16 MiB, when unset); ``status.truncated`` says a cap was hit.
        """
        start = self._start(cmd, timeout, cwd, env, user, max_output_bytes=max_output_bytes)
        stub, access = self._executor()
        with translate_errors():
            resp = stub.Run(
                _requests.run_request(start, stdin),
                metadata=access.metadata,
                timeout=call_deadline(timeout),
            )
        return exec_result(resp)

    def exec_stream(
        self,
        cmd: _requests.Command,
        timeout: float | None = None,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        stdin: Iterable[bytes] | bytes | str | None = None,
        user: str | None = None,
        max_output_bytes: int | None = None,
    ) -> Iterator[ExecEvent]:
        """Yield :class:`OutputChunk` events as the command writes, then its :class:`ExecStatus`.

        ``stdin`` may be an iterable of byte chunks, fed as the command reads.
        Stopping the iteration early cancels the call, which kills the command.
        """
        stdin_chunks = [_requests.as_bytes(stdin)] if isinstance(stdin, (bytes, str)) else stdin
        start = self._start(
            cmd,
            timeout,
            cwd,
            env,
            user,
            stdin=stdin_chunks is not None,
            max_output_bytes=max_output_bytes,
        )
        stub, access = self._executor()
        call = stub.Exec(_requests.exec_requests(start, stdin_chunks), metadata=access.metadata)
        try:
            with translate_errors():
                for msg in call:
                    event = exec_event(msg)
                    if event is not None:
                        yield event
        finally:
            call.cancel()  # type: ignore[no-untyped-call]

    def session(
        self, cwd: str | None = None, env: Mapping[str, str] | None = None, user: str | None = None
    ) -> Session:
        """A persistent shell: cwd, variables and functions survive between ``run`` calls."""
        stub, access = self._executor()
        with translate_errors():
            msg = stub.CreateSession(
                self._create_session_request(cwd, env, user), metadata=access.metadata
            )
        return Session(self, msg.session_id)

    def kill_all(self, signal: int = 9) -> int:
        """Signal every process in the sandbox but its init (what commands left
        behind, running commands and sessions alike); returns how many. With
        SIGKILL (the default) it returns once they are gone."""
        stub, access = self._executor()
        with translate_errors():
            resp = stub.KillAll(
                executor_pb2.KillAllRequest(sandbox_id=self.id, signal=signal),
                metadata=access.metadata,
            )
        return resp.killed

    def write_file(
        self,
        path: str,
        data: _requests.FileData,
        mode: int | None = None,
        make_parents: bool = True,
    ) -> int:
        """Write ``data`` (bytes, str, or a binary file object, streamed) to ``path``; returns its size."""
        requests = _requests.write_requests(
            self.id, _requests.check_remote_path(path), data, mode, make_parents
        )
        stub, access = self._executor()
        with translate_errors():
            return stub.WriteFile(requests, metadata=access.metadata).size

    def iter_file(self, path: str) -> Iterator[bytes]:
        """The file's content in chunks, as they arrive."""
        request = self._read_request(path)
        stub, access = self._executor()
        with translate_errors():
            for chunk in stub.ReadFile(request, metadata=access.metadata):
                if chunk.data:
                    yield chunk.data

    def read_file(self, path: str) -> bytes:
        """The whole file (use :meth:`download_file` for large files)."""
        return b"".join(self.iter_file(path))

    def download_file(self, path: str, local_path: str | os.PathLike[str]) -> int:
        """Stream a file to ``local_path``; returns bytes written."""
        written = 0
        with open(local_path, "wb") as f:
            for chunk in self.iter_file(path):
                f.write(chunk)
                written += len(chunk)
        return written

    def upload(self, local_dir: str | os.PathLike[str], remote_dir: str) -> tuple[int, int]:
        """Copy the contents of a local directory into ``remote_dir``; returns (files, bytes)."""
        chunks = _tar.tar_stream(_tar.checked_local_dir(local_dir))
        requests = _requests.upload_requests(
            self.id, _requests.check_remote_path(remote_dir, "remote_dir"), chunks
        )
        stub, access = self._executor()
        with translate_errors():
            resp = stub.Upload(requests, metadata=access.metadata)
        return resp.files, resp.bytes

    def download(self, remote_dir: str, local_dir: str | os.PathLike[str]) -> _tar.DownloadResult:
        """Copy a remote directory's contents (or one file) into ``local_dir``.

        Members named outside ``local_dir`` raise :class:`PathEscapeError`; links
        pointing outside it are skipped and listed in the result.
        """
        request = self._download_request(remote_dir)
        stub, access = self._executor()
        stream = stub.Download(request, metadata=access.metadata)
        try:
            with translate_errors():
                return _tar.extract_stream((c.data for c in stream), local_dir)
        finally:
            stream.cancel()  # type: ignore[no-untyped-call]


class Session:
    """A persistent shell session in a sandbox; close it (or use ``with``) when done."""

    def __init__(self, sandbox: Sandbox, session_id: str) -> None:
        self.sandbox = sandbox
        self.id = session_id

    def run(self, command: str, timeout: float | None = None) -> ExecResult:
        stub, access = self.sandbox._executor()
        request = session_run_request(self.sandbox.id, self.id, command, timeout)
        with translate_errors():
            resp = stub.SessionRun(
                request, metadata=access.metadata, timeout=call_deadline(timeout)
            )
        return exec_result(resp)

    def interrupt(self) -> None:
        """Send SIGINT to the command running in the session (like Ctrl-C)."""
        stub, access = self.sandbox._executor()
        with translate_errors():
            stub.InterruptSession(session_ref(self.sandbox.id, self.id), metadata=access.metadata)

    def close(self) -> None:
        stub, access = self.sandbox._executor()
        with translate_errors():
            stub.CloseSession(session_ref(self.sandbox.id, self.id), metadata=access.metadata)

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()
