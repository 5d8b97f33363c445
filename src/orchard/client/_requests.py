"""Building request messages (pure functions shared by the sync and async faces)."""

from __future__ import annotations

import io
import os
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import BinaryIO, Generic, TypeVar

from orchard._proto.orchard.v1 import common_pb2, executor_pb2, sandbox_pb2

from . import _values
from ._errors import InvalidRequestError
from ._network import NetworkPolicy

CHUNK_BYTES = 256 * 1024
"""Size of file and tar chunks on the wire (well under gRPC's 4 MiB message cap)."""

R = TypeVar("R")

Command = str | Sequence[str]
Stdin = bytes | str | None
FileData = bytes | str | BinaryIO


def create_request(
    image: str | None = None,
    cpu: _values.Cpu | None = None,
    memory: _values.Memory | None = None,
    network: str | NetworkPolicy | None = None,
    ttl: _values.Ttl | None = None,
    labels: Mapping[str, str] | None = None,
    env: Mapping[str, str] | None = None,
    request_id: str | None = None,
    pids: int | None = None,
    template: str | None = None,
    model_endpoint: bool = False,
    tools: _values.Tools | None = None,
) -> sandbox_pb2.CreateSandboxRequest:
    return sandbox_pb2.CreateSandboxRequest(
        image=image or "",
        resources=common_pb2.Resources(
            cpu_millis=_values.cpu_millis(cpu),
            memory_bytes=_values.memory_bytes(memory),
            pids=pids or 0,
        ),
        network=_values.network_policy(network),
        ttl_seconds=_values.ttl_seconds(ttl),
        labels=dict(labels or {}),
        env=dict(env or {}),
        request_id=request_id or "",
        template=template or "",
        model_endpoint=bool(model_endpoint),
        tool_layers=_values.tool_layers(tools),
    )


def get_request(sandbox_id: str) -> sandbox_pb2.GetSandboxRequest:
    return sandbox_pb2.GetSandboxRequest(id=sandbox_id)


def list_request(labels: Mapping[str, str] | None) -> sandbox_pb2.ListSandboxesRequest:
    return sandbox_pb2.ListSandboxesRequest(labels=dict(labels or {}))


def delete_request(sandbox_id: str) -> sandbox_pb2.DeleteSandboxRequest:
    if not sandbox_id:
        raise InvalidRequestError("sandbox_id: empty")
    return sandbox_pb2.DeleteSandboxRequest(id=sandbox_id)


def kill_all_request(sandbox_id: str, signal: int) -> executor_pb2.KillAllRequest:
    return executor_pb2.KillAllRequest(sandbox_id=sandbox_id, signal=signal)


def keepalive_request(sandbox_id: str, ttl: _values.Ttl | None) -> sandbox_pb2.KeepAliveRequest:
    return sandbox_pb2.KeepAliveRequest(id=sandbox_id, ttl_seconds=_values.ttl_seconds(ttl))


def exec_start(
    sandbox_id: str,
    cmd: Command,
    *,
    timeout: float | None = None,
    cwd: str | None = None,
    env: Mapping[str, str] | None = None,
    user: str | None = None,
    stdin: bool = False,
    max_output_bytes: int | None = None,
) -> executor_pb2.ExecStart:
    """A str ``cmd`` runs through ``/bin/sh -c``; a sequence runs as an argv (PATH lookup)."""
    if isinstance(cmd, str):
        if not cmd.strip():
            raise InvalidRequestError("cmd: empty command")
        argv: list[str] = []
        shell = cmd
    else:
        argv = [str(a) for a in cmd]
        shell = ""
        if not argv:
            raise InvalidRequestError("cmd: empty argument list")
    if timeout is not None and timeout <= 0:
        raise InvalidRequestError(f"timeout: must be positive seconds (got {timeout})")
    return executor_pb2.ExecStart(
        sandbox_id=sandbox_id,
        argv=argv,
        shell=shell,
        cwd=cwd or "",
        env=dict(env or {}),
        user=user or "",
        timeout_seconds=timeout or 0.0,
        max_output_bytes=max_output_bytes or 0,
        stdin=stdin,
    )


def as_bytes(data: bytes | str) -> bytes:
    return data.encode() if isinstance(data, str) else data


def run_request(start: executor_pb2.ExecStart, stdin: Stdin) -> executor_pb2.RunRequest:
    return executor_pb2.RunRequest(start=start, stdin=as_bytes(stdin) if stdin is not None else b"")


def stdin_chunks(stdin: Iterable[bytes | str] | bytes | str | None) -> Iterable[bytes | str] | None:
    """``exec_stream``'s stdin as an iterable of chunks (one chunk for bytes or str)."""
    return [stdin] if isinstance(stdin, (bytes, str)) else stdin


def stdin_requests(chunk: bytes | str) -> Iterator[executor_pb2.ExecRequest]:
    """One stdin chunk as Exec requests, split to the wire's chunk size."""
    for piece in _split(as_bytes(chunk)):
        yield executor_pb2.ExecRequest(stdin=piece)


CLOSE_STDIN = executor_pb2.ExecRequest(close_stdin=True)


def exec_requests(
    start: executor_pb2.ExecStart, stdin: Iterable[bytes | str] | None
) -> Iterator[executor_pb2.ExecRequest]:
    """The bidi Exec request stream: start, stdin chunks, close."""
    yield executor_pb2.ExecRequest(start=start)
    if stdin is not None:
        for chunk in stdin:
            yield from stdin_requests(chunk)
        yield CLOSE_STDIN


def _split(data: bytes) -> Iterator[bytes]:
    for i in range(0, len(data), CHUNK_BYTES):
        yield data[i : i + CHUNK_BYTES]


def check_file_data(data: object) -> None:
    """Refuse, before any call, data that is not bytes, text or a binary file object."""
    if isinstance(data, (bytes, bytearray, memoryview, str)):
        return
    if isinstance(data, io.TextIOBase):
        raise InvalidRequestError("data: open the file in binary mode ('rb')")
    if not callable(getattr(data, "read", None)):
        raise TypeError(f"data: bytes, str or a binary file object, not {type(data).__name__}")


def file_chunks(data: FileData) -> Iterator[bytes]:
    """Chunks of ``data`` (bytes, text or a binary file object read as it goes)."""
    if isinstance(data, (bytes, bytearray, memoryview, str)):
        raw = data.encode() if isinstance(data, str) else bytes(data)
        if not raw:
            return
        yield from _split(raw)
        return
    if isinstance(data, io.TextIOBase):
        raise InvalidRequestError("data: open the file in binary mode ('rb')")
    while True:
        chunk = data.read(CHUNK_BYTES)
        if not chunk:
            return
        if not isinstance(chunk, (bytes, bytearray, memoryview)):
            raise TypeError(
                f"data: the file object's read() gave {type(chunk).__name__}, not bytes"
                " (open it in binary mode)"
            )
        yield bytes(chunk)


class CapturedStream(Generic[R]):
    """A request stream that keeps what its source raised.

    gRPC turns a request iterator that raises into a cancelled call (grpc.aio raises
    ``CancelledError``, the sync stub a CANCELLED status), losing the cause: a file that
    could not be read, data of the wrong type. The caller calls :meth:`reraise` when the call
    fails, so the user sees the real error.
    """

    def __init__(self, source: Iterator[R]) -> None:
        self._source = source
        self.error: Exception | None = None

    def __iter__(self) -> CapturedStream[R]:
        return self

    def __next__(self) -> R:
        try:
            return next(self._source)
        except StopIteration:
            raise
        except Exception as err:
            self.error = err
            raise

    def reraise(self) -> None:
        if self.error is not None:
            raise self.error


def write_requests(
    sandbox_id: str,
    path: str,
    data: FileData,
    mode: int | None,
    make_parents: bool,
    owner: str = "",
) -> CapturedStream[executor_pb2.WriteFileRequest]:
    """The WriteFile request stream (``data`` checked now: a wrong type is a ``TypeError``
    here, not a cancelled call later)."""
    check_file_data(data)
    return CapturedStream(_write_requests(sandbox_id, path, data, mode, make_parents, owner))


def _write_requests(
    sandbox_id: str,
    path: str,
    data: FileData,
    mode: int | None,
    make_parents: bool,
    owner: str,
) -> Iterator[executor_pb2.WriteFileRequest]:
    yield executor_pb2.WriteFileRequest(
        header=executor_pb2.WriteFileHeader(
            sandbox_id=sandbox_id,
            path=path,
            mode=mode or 0,
            make_parents=make_parents,
            owner=owner,
        )
    )
    size = 0
    for chunk in file_chunks(data):
        size += len(chunk)
        yield executor_pb2.WriteFileRequest(data=chunk)
    # The server writes the file only on this: a stream cut short writes nothing.
    yield executor_pb2.WriteFileRequest(end=executor_pb2.WriteFileEnd(size=size))


def upload_requests(
    sandbox_id: str, remote_dir: str, tar_chunks: Iterable[bytes], owner: str = ""
) -> CapturedStream[executor_pb2.UploadRequest]:
    """The Upload request stream (what reading the local folder raised is kept)."""
    return CapturedStream(_upload_requests(sandbox_id, remote_dir, tar_chunks, owner))


def _upload_requests(
    sandbox_id: str, remote_dir: str, tar_chunks: Iterable[bytes], owner: str
) -> Iterator[executor_pb2.UploadRequest]:
    yield executor_pb2.UploadRequest(
        header=executor_pb2.UploadHeader(sandbox_id=sandbox_id, path=remote_dir, owner=owner)
    )
    for chunk in tar_chunks:
        yield executor_pb2.UploadRequest(data=chunk)


def check_remote_path(path: str, what: str = "path") -> str:
    if not path:
        raise InvalidRequestError(f"{what}: empty path")
    if "\x00" in path:
        raise InvalidRequestError(f"{what}: contains a NUL byte")
    return path


def local_path(path: str | os.PathLike[str]) -> str:
    return os.fspath(path)


def network_update_request(
    sandbox_id: str,
    network: str | NetworkPolicy,
    cidrs: Iterable[str] = (),
    ports: Iterable[int] = (),
    domains: Iterable[str] = (),
) -> sandbox_pb2.UpdateNetworkPolicyRequest:
    """``network`` as a mode name (with the lists) or a whole :class:`NetworkPolicy`."""
    extra = (tuple(cidrs), tuple(ports), tuple(domains))
    if isinstance(network, str):
        policy = NetworkPolicy(network, *extra)
    elif any(extra):
        raise InvalidRequestError("network: give lists either in the NetworkPolicy or as keywords")
    else:
        policy = network
    return sandbox_pb2.UpdateNetworkPolicyRequest(id=sandbox_id, network=policy.to_proto())
