"""The asyncio face: ``AsyncSandbox`` and ``AsyncSession`` over grpc.aio.

The same methods as the sync face, awaited; requests, models and error
mapping come from the same shared core. Local file work (tar, files) runs in
worker threads so the event loop never blocks on disk.
"""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import os
import queue
import socket
import threading
from collections.abc import AsyncIterable, AsyncIterator, Iterable, Iterator, Mapping
from types import TracebackType
from typing import TYPE_CHECKING, Self, TypeVar

from orchard._proto.orchard.v1 import executor_pb2, executor_pb2_grpc

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
from ._ports_async import AsyncPortForward, connect_port
from ._process_async import AsyncSandboxProcesses

if TYPE_CHECKING:
    from ._async_client import AsyncOrchard

_END = object()
R = TypeVar("R")


class AsyncSandbox(AsyncSandboxProcesses, SandboxCore):
    """A sandbox, driven from asyncio. Make one with ``await client.sandboxes.create(...)``
    (or ``await AsyncSandbox.create(...)``, which uses the default client).

    Used as an async context manager, it is deleted on exit.
    """

    client: AsyncOrchard

    @classmethod
    async def create(
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
        timeout: float | None = 120.0,  # noqa: ASYNC109 (the call's deadline)
        template: str | None = None,
        files: Mapping[str, _requests.FileData] | None = None,
        wait_for_quota: float = 0.0,
        model_endpoint: bool = False,
        tools: _values.Tools | None = None,
    ) -> AsyncSandbox:
        """See :meth:`Sandbox.create` (same arguments and units)."""
        from ._default import default_async_client

        return await default_async_client(endpoint, api_key).sandboxes.create(
            image, cpu, memory, network, ttl, labels, env, request_id, pids, timeout, template,
            files, wait_for_quota, model_endpoint, tools,
        )  # fmt: skip

    @classmethod
    async def connect(
        cls, sandbox_id: str, endpoint: str | None = None, api_key: str | None = None
    ) -> AsyncSandbox:
        """See :meth:`Sandbox.connect`."""
        from ._default import default_async_client

        return await default_async_client(endpoint, api_key).sandboxes.connect(sandbox_id)

    @staticmethod
    async def list(
        labels: Mapping[str, str] | None = None,
        endpoint: str | None = None,
        api_key: str | None = None,
    ) -> builtins.list[SandboxInfo]:
        """See :meth:`Sandbox.list`."""
        from ._default import default_async_client

        return await default_async_client(endpoint, api_key).sandboxes.list(labels)

    @staticmethod
    async def images(
        endpoint: str | None = None, api_key: str | None = None
    ) -> builtins.list[ImageInfo]:
        """See :meth:`Sandbox.images`."""
        from ._default import default_async_client

        return await default_async_client(endpoint, api_key).images.list()

    @staticmethod
    async def delete_by_id(
        sandbox_id: str, endpoint: str | None = None, api_key: str | None = None
    ) -> None:
        """See :meth:`Sandbox.delete_by_id`."""
        from ._default import default_async_client

        await default_async_client(endpoint, api_key).sandboxes.delete(sandbox_id)

    async def info(self) -> SandboxInfo:
        """See :meth:`Sandbox.info`."""
        with translate_errors():
            msg = await self.client._control().GetSandbox(
                self._get_request(), metadata=self.client.api_metadata
            )
        self._remember(msg)
        return self._info

    async def set_network(
        self,
        network: str | NetworkPolicy,
        *,
        cidrs: Iterable[str] = (),
        ports: Iterable[int] = (),
        domains: Iterable[str] = (),
    ) -> SandboxInfo:
        """See :meth:`Sandbox.set_network`."""
        request = _requests.network_update_request(self.id, network, cidrs, ports, domains)
        with translate_errors():
            msg = await self.client._control().UpdateNetworkPolicy(
                request, metadata=self.client.api_metadata
            )
        self._remember(msg)
        return self._info

    async def keepalive(self, ttl: _values.Ttl | None = None) -> SandboxInfo:
        """See :meth:`Sandbox.keepalive`."""
        with translate_errors():
            msg = await self.client._control().KeepAlive(
                _requests.keepalive_request(self.id, ttl), metadata=self.client.api_metadata
            )
        self._remember(msg)
        return self._info

    async def delete(self) -> None:
        """See :meth:`Sandbox.delete`."""
        await self.client.sandboxes.delete(self.id)
        self._deleted = True

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        if not self._deleted:
            with contextlib.suppress(SandboxNotFoundError):
                await self.delete()

    # ---- data plane ---------------------------------------------------------

    async def _executor(self) -> tuple[executor_pb2_grpc.ExecutorServiceAsyncStub, ExecutorAccess]:
        access = self._usable_access()
        if access is None:
            with translate_errors():
                msg = await self.client._control().GetExecutorAccess(
                    self._get_request(), metadata=self.client.api_metadata
                )
            access = self._set_access(msg)
        return self.client._executor(self.client.data_plane_address(access)), access

    async def exec(
        self,
        cmd: _requests.Command,
        timeout: float | None = None,  # noqa: ASYNC109 (the command's own timeout)
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        stdin: _requests.Stdin = None,
        user: str | None = None,
        max_output_bytes: int | None = None,
    ) -> ExecResult:
        """See :meth:`Sandbox.exec`."""
        start = self._start(cmd, timeout, cwd, env, user, max_output_bytes=max_output_bytes)
        stub, access = await self._executor()
        with translate_errors():
            resp = await stub.Run(
                _requests.run_request(start, stdin),
                metadata=access.metadata,
                timeout=call_deadline(timeout),
            )
        return exec_result(resp)

    async def exec_stream(
        self,
        cmd: _requests.Command,
        timeout: float | None = None,  # noqa: ASYNC109 (the command's own timeout)
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        stdin: AsyncIterable[bytes | str] | Iterable[bytes | str] | bytes | str | None = None,
        user: str | None = None,
        max_output_bytes: int | None = None,
    ) -> AsyncIterator[ExecEvent]:
        """See :meth:`Sandbox.exec_stream`; ``stdin`` may also be an async iterable."""
        start = self._start(
            cmd,
            timeout,
            cwd,
            env,
            user,
            stdin=stdin is not None,
            max_output_bytes=max_output_bytes,
        )
        stub, access = await self._executor()
        call = stub.Exec(_exec_requests(start, stdin), metadata=access.metadata)
        try:
            with translate_errors():
                async for msg in call:
                    event = exec_event(msg)
                    if event is not None:
                        yield event
        finally:
            call.cancel()  # type: ignore[no-untyped-call]

    async def session(
        self, cwd: str | None = None, env: Mapping[str, str] | None = None, user: str | None = None
    ) -> AsyncSession:
        """See :meth:`Sandbox.session`."""
        stub, access = await self._executor()
        with translate_errors():
            msg = await stub.CreateSession(
                self._create_session_request(cwd, env, user), metadata=access.metadata
            )
        return AsyncSession(self, msg.session_id)

    async def kill_all(self, signal: int = 9) -> int:
        """Signal every process in the sandbox but its init; returns how many
        (see :meth:`Sandbox.kill_all`)."""
        stub, access = await self._executor()
        with translate_errors():
            resp = await stub.KillAll(
                _requests.kill_all_request(self.id, signal), metadata=access.metadata
            )
        return resp.killed

    async def forward_port(
        self, port: int, local_port: int = 0, host: str = "127.0.0.1"
    ) -> AsyncPortForward:
        """A listener on 127.0.0.1 carrying each connection to ``port`` inside the
        sandbox, served on this loop (see :meth:`Sandbox.forward_port`); use
        ``async with await sb.forward_port(port) as fwd``."""
        return await AsyncPortForward(self._executor, self.id, port, host, local_port)._start()

    async def connect_port(self, port: int, host: str = "127.0.0.1") -> socket.socket:
        """One connection to ``port`` inside the sandbox, as a connected socket relayed
        on this loop (``asyncio.open_connection(sock=...)`` makes streams of it)."""
        return await connect_port(self._executor, self.id, port, host)

    async def write_file(
        self,
        path: str,
        data: _requests.FileData,
        mode: int | None = None,
        make_parents: bool = True,
        owner: _files.Owner | None = None,
    ) -> int:
        """See :meth:`Sandbox.write_file`."""
        requests = _requests.write_requests(
            self.id,
            _requests.check_remote_path(path),
            data,
            mode,
            make_parents,
            _files.owner_spec(owner),
        )
        stub, access = await self._executor()
        try:
            with translate_errors():
                resp = await stub.WriteFile(_in_thread_requests(requests), metadata=access.metadata)
        except BaseException:
            requests.reraise()
            raise
        return resp.size

    async def iter_file(self, path: str) -> AsyncIterator[bytes]:
        """See :meth:`Sandbox.iter_file`."""
        request = self._read_request(path)
        stub, access = await self._executor()
        with translate_errors():
            async for chunk in stub.ReadFile(request, metadata=access.metadata):
                if chunk.data:
                    yield chunk.data

    async def read_file(self, path: str) -> bytes:
        """See :meth:`Sandbox.read_file`."""
        return b"".join([c async for c in self.iter_file(path)])

    async def download_file(self, path: str, local_path: str | os.PathLike[str]) -> int:
        """See :meth:`Sandbox.download_file`."""
        written = 0
        f = await asyncio.to_thread(open, local_path, "wb")
        try:
            async for chunk in self.iter_file(path):
                await asyncio.to_thread(f.write, chunk)
                written += len(chunk)
        finally:
            await asyncio.to_thread(f.close)
        return written

    async def upload(
        self,
        local_dir: str | os.PathLike[str],
        remote_dir: str,
        owner: _files.Owner | None = None,
    ) -> tuple[int, int]:
        chunks = _tar.tar_stream(_tar.checked_local_dir(local_dir))
        requests = _requests.upload_requests(
            self.id,
            _requests.check_remote_path(remote_dir, "remote_dir"),
            chunks,
            _files.owner_spec(owner),
        )
        stub, access = await self._executor()
        try:
            with translate_errors():
                resp = await stub.Upload(_in_thread_requests(requests), metadata=access.metadata)
        except BaseException:
            requests.reraise()
            raise
        return resp.files, resp.bytes

    async def download(
        self, remote_dir: str, local_dir: str | os.PathLike[str]
    ) -> _tar.DownloadResult:
        """See :meth:`Sandbox.download`; extraction runs in a worker thread fed chunk by chunk."""
        request = self._download_request(remote_dir)
        stub, access = await self._executor()
        handoff: queue.Queue[object] = queue.Queue(maxsize=8)
        stopped = threading.Event()

        def chunks() -> Iterator[bytes]:
            while (item := handoff.get()) is not _END:
                assert isinstance(item, bytes)
                yield item

        def extract() -> _tar.DownloadResult:
            try:
                return _tar.extract_stream(chunks(), local_dir)
            finally:
                stopped.set()

        def put(item: object) -> None:
            # Bounded hand-off (backpressure) that gives up once the extractor has stopped.
            while not stopped.is_set():
                try:
                    handoff.put(item, timeout=0.1)
                    return
                except queue.Full:
                    continue

        extractor = asyncio.ensure_future(asyncio.to_thread(extract))
        call = stub.Download(request, metadata=access.metadata)
        try:
            with translate_errors():
                async for msg in call:
                    if stopped.is_set():
                        break  # the archive ended, or extraction failed (raised below)
                    await asyncio.to_thread(put, msg.data)
        finally:
            call.cancel()  # type: ignore[no-untyped-call]
            await asyncio.to_thread(put, _END)
        return await extractor

    # ---- file operations (see Sandbox and _files) ----------------------------

    async def list_dir(
        self, path: str, depth: int = 1, max_entries: int | None = None
    ) -> builtins.list[_files.FileEntry]:
        """See :meth:`Sandbox.list_dir`."""
        return (await self.list_dir_page(path, depth, max_entries))[0]

    async def list_dir_page(
        self, path: str, depth: int = 1, max_entries: int | None = None
    ) -> tuple[builtins.list[_files.FileEntry], bool]:
        """See :meth:`Sandbox.list_dir_page`."""
        request = _files.list_request(self.id, path, depth, max_entries)
        stub, access = await self._executor()
        with translate_errors():
            resp = await stub.ListDir(request, metadata=access.metadata)
        return [_files.file_entry(e) for e in resp.entries], resp.truncated

    async def stat(self, path: str, follow_symlinks: bool = True) -> _files.FileEntry:
        """See :meth:`Sandbox.stat`."""
        request = _files.stat_request(self.id, path, follow_symlinks)
        stub, access = await self._executor()
        with translate_errors():
            return _files.file_entry(await stub.Stat(request, metadata=access.metadata))

    async def exists(self, path: str) -> bool:
        """See :meth:`Sandbox.exists`."""
        try:
            await self.stat(path)
        except PathNotFoundError:
            return False
        return True

    async def remove(self, path: str, recursive: bool = False) -> int:
        """See :meth:`Sandbox.remove`."""
        request = _files.remove_request(self.id, path, recursive)
        stub, access = await self._executor()
        with translate_errors():
            return (await stub.Remove(request, metadata=access.metadata)).removed

    async def rename(self, source: str, destination: str) -> None:
        """See :meth:`Sandbox.rename`."""
        request = _files.rename_request(self.id, source, destination)
        stub, access = await self._executor()
        with translate_errors():
            await stub.Rename(request, metadata=access.metadata)

    async def make_dir(
        self,
        path: str,
        parents: bool = True,
        exist_ok: bool = True,
        mode: int | None = None,
        owner: _files.Owner | None = None,
    ) -> bool:
        """See :meth:`Sandbox.make_dir`."""
        request = _files.make_dir_request(self.id, path, parents, mode, owner)
        stub, access = await self._executor()
        with translate_errors():
            created = (await stub.MakeDir(request, metadata=access.metadata)).created
        return _files.made_dir(created, path, exist_ok)


async def _in_thread_requests(requests: Iterator[R]) -> AsyncIterator[R]:
    """Produce a request stream whose building reads the disk, off the event loop."""
    while True:
        item = await asyncio.to_thread(next, requests, _END)
        if item is _END:
            return
        yield item  # type: ignore[misc]


async def _exec_requests(
    start: executor_pb2.ExecStart,
    stdin: AsyncIterable[bytes | str] | Iterable[bytes | str] | bytes | str | None,
) -> AsyncIterator[executor_pb2.ExecRequest]:
    """The bidi Exec request stream, as :func:`_requests.exec_requests` builds it, but fed
    from an async iterable too."""
    if not isinstance(stdin, AsyncIterable):
        for request in _requests.exec_requests(start, _requests.stdin_chunks(stdin)):
            yield request
        return
    yield executor_pb2.ExecRequest(start=start)
    async for chunk in stdin:
        for request in _requests.stdin_requests(chunk):
            yield request
    yield _requests.CLOSE_STDIN


class AsyncSession:
    """See :class:`Session`."""

    def __init__(self, sandbox: AsyncSandbox, session_id: str) -> None:
        self.sandbox = sandbox
        self.id = session_id

    async def run(self, command: str, timeout: float | None = None) -> ExecResult:  # noqa: ASYNC109
        """See :meth:`Session.run`."""
        stub, access = await self.sandbox._executor()
        request = session_run_request(self.sandbox.id, self.id, command, timeout)
        with translate_errors():
            resp = await stub.SessionRun(
                request, metadata=access.metadata, timeout=call_deadline(timeout)
            )
        return exec_result(resp)

    async def interrupt(self) -> None:
        """See :meth:`Session.interrupt`."""
        stub, access = await self.sandbox._executor()
        with translate_errors():
            await stub.InterruptSession(
                session_ref(self.sandbox.id, self.id), metadata=access.metadata
            )

    async def close(self) -> None:
        """See :meth:`Session.close`."""
        stub, access = await self.sandbox._executor()
        with translate_errors():
            await stub.CloseSession(session_ref(self.sandbox.id, self.id), metadata=access.metadata)

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()
