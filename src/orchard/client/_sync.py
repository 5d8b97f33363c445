"""The synchronous face: ``Sandbox`` and ``Session`` over the sync gRPC channel.

Every method builds its request with the shared core, makes one call, and
parses the answer with the shared models; errors cross ``translate_errors``.
"""

from __future__ import annotations

import builtins
import contextlib
import os
import socket
from collections.abc import Iterable, Iterator, Mapping
from types import TracebackType
from typing import TYPE_CHECKING, Self

from orchard._proto.orchard.v1 import executor_pb2_grpc

from . import _files, _requests, _tar, _values
from ._core import (
    ExecutorAccess,
    SandboxCore,
    call_deadline,
    session_ref,
    session_run_request,
    translate_errors,
)
from ._errors import PathNotFoundError, SandboxNotFoundError
from ._models import (
    ExecEvent,
    ExecResult,
    ImageInfo,
    SandboxInfo,
    exec_event,
    exec_result,
)
from ._network import NetworkPolicy
from ._ports_sync import PortForward, connect_port
from ._process_sync import SandboxProcesses

if TYPE_CHECKING:
    from ._sync_client import Orchard


class Sandbox(SandboxProcesses, SandboxCore):
    """A sandbox, driven synchronously. Make one with ``client.sandboxes.create(...)``
    (or :meth:`create`, which uses the default client).

    Used as a context manager, it is deleted on exit.
    """

    client: Orchard

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
        model_endpoint: bool = False,
        tools: _values.Tools | None = None,
    ) -> Sandbox:
        """``default_client(endpoint, api_key).sandboxes.create(...)``: see :meth:`Sandboxes.create`."""
        from ._default import default_client

        return default_client(endpoint, api_key).sandboxes.create(
            image, cpu, memory, network, ttl, labels, env, request_id, pids, timeout, template,
            files, wait_for_quota, model_endpoint, tools,
        )  # fmt: skip

    @classmethod
    def connect(
        cls, sandbox_id: str, endpoint: str | None = None, api_key: str | None = None
    ) -> Sandbox:
        """A handle on an existing sandbox (the default client's :meth:`Sandboxes.connect`)."""
        from ._default import default_client

        return default_client(endpoint, api_key).sandboxes.connect(sandbox_id)

    @staticmethod
    def list(
        labels: Mapping[str, str] | None = None,
        endpoint: str | None = None,
        api_key: str | None = None,
    ) -> builtins.list[SandboxInfo]:
        """The caller's sandboxes (the default client's :meth:`Sandboxes.list`)."""
        from ._default import default_client

        return default_client(endpoint, api_key).sandboxes.list(labels)

    @staticmethod
    def images(endpoint: str | None = None, api_key: str | None = None) -> builtins.list[ImageInfo]:
        """The images sandboxes can be made from (the default client's :meth:`Images.list`)."""
        from ._default import default_client

        return default_client(endpoint, api_key).images.list()

    @staticmethod
    def delete_by_id(
        sandbox_id: str, endpoint: str | None = None, api_key: str | None = None
    ) -> None:
        """Delete a sandbox by id (the default client's :meth:`Sandboxes.delete`)."""
        from ._default import default_client

        default_client(endpoint, api_key).sandboxes.delete(sandbox_id)

    def info(self) -> SandboxInfo:
        """The sandbox's current state from the control plane."""
        with translate_errors():
            msg = self.client._control().GetSandbox(
                self._get_request(), metadata=self.client.api_metadata
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
            msg = self.client._control().UpdateNetworkPolicy(
                request, metadata=self.client.api_metadata
            )
        self._remember(msg)
        return self._info

    def keepalive(self, ttl: _values.Ttl | None = None) -> SandboxInfo:
        """Extend the lease: the sandbox now expires ``ttl`` seconds from now (default: its own ttl).

        Long jobs call this now and then (a heartbeat) instead of asking for a
        long ttl up front, so a crashed trainer's sandboxes are reaped soon.
        """
        with translate_errors():
            msg = self.client._control().KeepAlive(
                _requests.keepalive_request(self.id, ttl), metadata=self.client.api_metadata
            )
        self._remember(msg)
        return self._info

    def delete(self) -> None:
        """Delete the sandbox (waits until its container is gone). Deleting twice is fine."""
        self.client.sandboxes.delete(self.id)
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
                msg = self.client._control().GetExecutorAccess(
                    self._get_request(), metadata=self.client.api_metadata
                )
            access = self._set_access(msg)
        return self.client._executor(self.client.data_plane_address(access)), access

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
        stdin: Iterable[bytes | str] | bytes | str | None = None,
        user: str | None = None,
        max_output_bytes: int | None = None,
    ) -> Iterator[ExecEvent]:
        """Yield :class:`OutputChunk` events as the command writes, then its :class:`ExecStatus`.

        ``stdin`` may be an iterable of byte chunks, fed as the command reads.
        Stopping the iteration early cancels the call, which kills the command.
        """
        stdin_chunks = _requests.stdin_chunks(stdin)
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
                _requests.kill_all_request(self.id, signal), metadata=access.metadata
            )
        return resp.killed

    def forward_port(self, port: int, local_port: int = 0, host: str = "127.0.0.1") -> PortForward:
        """Listen on 127.0.0.1 (``local_port``; 0 picks a free one) and carry every
        connection to ``port`` on the sandbox's loopback (``host``: ``127.0.0.1`` or
        ``::1``) over the data plane; nothing is published and no network policy is
        opened. ``.url`` is ``http://127.0.0.1:NNNN``. Close it (or use ``with``) to stop."""
        return PortForward(self._executor, self.id, port, host, local_port)._start()

    def connect_port(self, port: int, host: str = "127.0.0.1") -> socket.socket:
        """One connection to ``port`` on the sandbox's loopback, as a connected socket
        (a Unix socket pair's end, relayed); :class:`PortNotListeningError` (also a
        ``ConnectionRefusedError``) when nothing listens there."""
        return connect_port(self._executor, self.id, port, host)

    def write_file(
        self,
        path: str,
        data: _requests.FileData,
        mode: int | None = None,
        make_parents: bool = True,
        owner: _files.Owner | None = None,
    ) -> int:
        """Write ``data`` (bytes, str, or a binary file object, streamed) to ``path``; returns its size.

        ``owner`` (a user name, uid, "user:group" or (uid, gid), resolved in the
        sandbox) owns the file and the parents this call creates; by default a new
        file is root's and a replaced one keeps its owner.
        """
        requests = _requests.write_requests(
            self.id,
            _requests.check_remote_path(path),
            data,
            mode,
            make_parents,
            _files.owner_spec(owner),
        )
        stub, access = self._executor()
        try:
            with translate_errors():
                return stub.WriteFile(requests, metadata=access.metadata).size
        except Exception:
            requests.reraise()
            raise

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

    def upload(
        self,
        local_dir: str | os.PathLike[str],
        remote_dir: str,
        owner: _files.Owner | None = None,
    ) -> tuple[int, int]:
        """Copy the contents of a local directory into ``remote_dir``; returns (files, bytes).

        ``owner`` (as in :meth:`write_file`) owns everything unpacked; root by default.
        """
        chunks = _tar.tar_stream(_tar.checked_local_dir(local_dir))
        requests = _requests.upload_requests(
            self.id,
            _requests.check_remote_path(remote_dir, "remote_dir"),
            chunks,
            _files.owner_spec(owner),
        )
        stub, access = self._executor()
        try:
            with translate_errors():
                resp = stub.Upload(requests, metadata=access.metadata)
        except Exception:
            requests.reraise()
            raise
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

    # ---- file operations (see _files for the names) --------------------------

    def list_dir(
        self, path: str, depth: int = 1, max_entries: int | None = None
    ) -> builtins.list[_files.FileEntry]:
        """The entries of the directory ``path`` (``depth`` levels down, at most 64;
        symlinks listed, never followed), depth-first and sorted by name per folder.

        At most ``max_entries`` come back (the server's default 10,000, ceiling
        100,000); :meth:`list_dir_page` also says whether the listing stopped there.
        """
        return self.list_dir_page(path, depth, max_entries)[0]

    def list_dir_page(
        self, path: str, depth: int = 1, max_entries: int | None = None
    ) -> tuple[builtins.list[_files.FileEntry], bool]:
        """:meth:`list_dir` and whether the listing stopped at ``max_entries``."""
        request = _files.list_request(self.id, path, depth, max_entries)
        stub, access = self._executor()
        with translate_errors():
            resp = stub.ListDir(request, metadata=access.metadata)
        return [_files.file_entry(e) for e in resp.entries], resp.truncated

    def stat(self, path: str, follow_symlinks: bool = True) -> _files.FileEntry:
        """One entry's metadata; :class:`PathNotFoundError` (a ``FileNotFoundError``) if missing."""
        request = _files.stat_request(self.id, path, follow_symlinks)
        stub, access = self._executor()
        with translate_errors():
            return _files.file_entry(stub.Stat(request, metadata=access.metadata))

    def exists(self, path: str) -> bool:
        """Whether ``path`` exists (a dangling symlink does not, like ``os.path.exists``)."""
        try:
            self.stat(path)
        except PathNotFoundError:
            return False
        return True

    def remove(self, path: str, recursive: bool = False) -> int:
        """Remove a file, a symlink (not its target) or an empty directory; a whole tree
        with ``recursive``. Returns how many entries were removed."""
        request = _files.remove_request(self.id, path, recursive)
        stub, access = self._executor()
        with translate_errors():
            return stub.Remove(request, metadata=access.metadata).removed

    def rename(self, source: str, destination: str) -> None:
        """Move ``source`` to ``destination`` (replacing a file there, like ``os.rename``).

        A directory that comes from the image itself cannot be renamed on the local
        runtime (overlayfs refuses; ``mv`` would copy it): that is an
        :class:`InvalidRequestError` saying so, and the directory stays where it was.
        """
        request = _files.rename_request(self.id, source, destination)
        stub, access = self._executor()
        with translate_errors():
            stub.Rename(request, metadata=access.metadata)

    def make_dir(
        self,
        path: str,
        parents: bool = True,
        exist_ok: bool = True,
        mode: int | None = None,
        owner: _files.Owner | None = None,
    ) -> bool:
        """Create a directory (``parents``: and missing parents, like ``mkdir -p``); returns
        False if it already existed (:class:`PathExistsError` if not ``exist_ok``)."""
        request = _files.make_dir_request(self.id, path, parents, mode, owner)
        stub, access = self._executor()
        with translate_errors():
            created = stub.MakeDir(request, metadata=access.metadata).created
        return _files.made_dir(created, path, exist_ok)


class Session:
    """A persistent shell session in a sandbox; close it (or use ``with``) when done."""

    def __init__(self, sandbox: Sandbox, session_id: str) -> None:
        self.sandbox = sandbox
        self.id = session_id

    def run(self, command: str, timeout: float | None = None) -> ExecResult:
        """Run ``command`` in the session's shell and wait for it (its cd, exports and functions stay)."""
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
        """End the session's shell."""
        stub, access = self.sandbox._executor()
        with translate_errors():
            stub.CloseSession(session_ref(self.sandbox.id, self.id), metadata=access.metadata)

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()
