"""Status code + orchard-reason + orchard-fault -> the SDK's exception tree; no RpcError leaks.

The table tests call the pure mapping. The wire tests run a real gRPC server
on a free port; its servicers are STAND-INS that answer with scripted errors
(a real scheduler cannot be made to fail on demand in every way).
"""

from __future__ import annotations

import asyncio
import errno
from collections.abc import Iterator
from concurrent import futures
from typing import Any

import grpc
import pytest
from google.protobuf.timestamp_pb2 import Timestamp

import orchard
from orchard._proto.orchard.v1 import executor_pb2, executor_pb2_grpc, sandbox_pb2, sandbox_pb2_grpc
from orchard.client._errors import error_from_status

C = grpc.StatusCode


@pytest.mark.parametrize(
    ("code", "reason", "fault", "expected"),
    [
        (C.NOT_FOUND, "SANDBOX_NOT_FOUND", "client", orchard.SandboxNotFoundError),
        (C.NOT_FOUND, "IMAGE_NOT_FOUND", "client", orchard.ImageNotFoundError),
        (C.NOT_FOUND, "PATH_NOT_FOUND", "client", orchard.PathNotFoundError),
        (C.PERMISSION_DENIED, "PATH_ESCAPE", "client", orchard.PathEscapeError),
        (C.FAILED_PRECONDITION, "IS_A_DIRECTORY", "client", orchard.PathIsADirectoryError),
        (C.FAILED_PRECONDITION, "NOT_A_DIRECTORY", "client", orchard.PathNotADirectoryError),
        (C.FAILED_PRECONDITION, "FILE_EXISTS", "client", orchard.PathExistsError),
        (C.FAILED_PRECONDITION, "SANDBOX_NOT_READY", "client", orchard.SandboxNotReadyError),
        (C.FAILED_PRECONDITION, "SESSION_BUSY", "client", orchard.SessionError),
        (C.INVALID_ARGUMENT, "INVALID_FIELD", "client", orchard.InvalidRequestError),
        (C.INVALID_ARGUMENT, "EXECUTABLE_NOT_FOUND", "client", orchard.CommandStartError),
        (C.UNAUTHENTICATED, "API_KEY_INVALID", "client", orchard.AuthenticationError),
        (C.UNAUTHENTICATED, "TOKEN_INVALID", "client", orchard.AuthenticationError),
        (C.RESOURCE_EXHAUSTED, "QUOTA_EXCEEDED", "client", orchard.QuotaExceededError),
        (C.UNAVAILABLE, "BACKEND_FAILURE", "infrastructure", orchard.InfrastructureError),
        (C.UNAVAILABLE, "", "", orchard.ServiceUnavailableError),
        (C.INTERNAL, "", "", orchard.InfrastructureError),
        (C.DEADLINE_EXCEEDED, "", "", orchard.DeadlineExceededError),
        (C.PERMISSION_DENIED, "", "", orchard.PermissionDeniedError),
        # An infrastructure fault is never blamed on the request, whatever the code.
        (C.NOT_FOUND, "", "infrastructure", orchard.InfrastructureError),
    ],
)
def test_mapping(
    code: grpc.StatusCode, reason: str, fault: str, expected: type[orchard.OrchardError]
) -> None:
    trailers = [(k, v) for k, v in (("orchard-reason", reason), ("orchard-fault", fault)) if v]
    err = error_from_status(code, "the message", trailers)
    assert type(err) is expected
    assert (err.code, err.reason, err.message) == (code.name, reason, "the message")
    assert err.is_infrastructure == (
        fault == "infrastructure" or (not fault and code in (C.UNAVAILABLE, C.INTERNAL))
    )


@pytest.mark.parametrize(
    ("reason", "code", "builtin", "errno_code"),
    [
        ("PATH_NOT_FOUND", C.NOT_FOUND, FileNotFoundError, errno.ENOENT),
        ("FILE_EXISTS", C.FAILED_PRECONDITION, FileExistsError, errno.EEXIST),
        ("IS_A_DIRECTORY", C.FAILED_PRECONDITION, IsADirectoryError, errno.EISDIR),
        ("NOT_A_DIRECTORY", C.FAILED_PRECONDITION, NotADirectoryError, errno.ENOTDIR),
        ("", C.PERMISSION_DENIED, PermissionError, errno.EACCES),
    ],
)
def test_file_errors_are_also_builtins(
    reason: str, code: grpc.StatusCode, builtin: type[OSError], errno_code: int
) -> None:
    """``except FileNotFoundError`` (etc.) catches the SDK's error, which stays an OrchardError."""
    trailers = [("orchard-reason", reason)] if reason else []
    err = error_from_status(code, "/tmp/x: the message", trailers)
    assert isinstance(err, builtin) and isinstance(err, orchard.OrchardError)
    assert err.errno == errno_code
    assert str(err) == "/tmp/x: the message"
    assert (err.code, err.reason) == (code.name, reason)
    assert issubclass(orchard.DeadlineExceededError, TimeoutError)


def test_quota_carries_retry_after() -> None:
    err = error_from_status(
        C.RESOURCE_EXHAUSTED,
        "slow down",
        [("orchard-reason", "QUOTA_EXCEEDED"), ("retry-after", "2.5")],
    )
    assert isinstance(err, orchard.QuotaExceededError) and err.retry_after == 2.5


class ScriptedControl(sandbox_pb2_grpc.SandboxServiceServicer):
    """STAND-IN control plane: creates succeed (pointing at the scripted executor), the rest fail."""

    def __init__(self, address: str) -> None:
        self.address = address

    def CreateSandbox(self, request: Any, context: grpc.ServicerContext) -> sandbox_pb2.Sandbox:
        return sandbox_pb2.Sandbox(
            id="sb-scripted0000", state=sandbox_pb2.READY,
            executor=sandbox_pb2.ExecutorAccess(address=self.address, token="t", token_expires_at=Timestamp(seconds=2**40)),
        )  # fmt: skip

    def ListSandboxes(
        self, request: Any, context: grpc.ServicerContext
    ) -> sandbox_pb2.ListSandboxesResponse:
        context.set_trailing_metadata(
            (("orchard-reason", "API_KEY_INVALID"), ("orchard-fault", "client"))
        )
        context.abort(C.UNAUTHENTICATED, "invalid API key")
        raise AssertionError


class ScriptedExecutor(executor_pb2_grpc.ExecutorServiceServicer):
    """STAND-IN executor: every call fails with a scripted status."""

    def Run(self, request: Any, context: grpc.ServicerContext) -> executor_pb2.RunResponse:
        context.set_trailing_metadata(
            (("orchard-reason", "EXECUTABLE_NOT_FOUND"), ("orchard-fault", "client"))
        )
        context.abort(C.INVALID_ARGUMENT, "nosuchcmd: not found")
        raise AssertionError

    def ReadFile(
        self, request: Any, context: grpc.ServicerContext
    ) -> Iterator[executor_pb2.FileChunk]:
        yield executor_pb2.FileChunk(data=b"partial")
        context.set_trailing_metadata(
            (("orchard-reason", "BACKEND_FAILURE"), ("orchard-fault", "infrastructure"))
        )
        context.abort(C.INTERNAL, "disk on fire")


@pytest.fixture
def scripted() -> Iterator[str]:
    server = grpc.server(futures.ThreadPoolExecutor(4))
    port = server.add_insecure_port("127.0.0.1:0")
    address = f"127.0.0.1:{port}"
    sandbox_pb2_grpc.add_SandboxServiceServicer_to_server(ScriptedControl(address), server)  # type: ignore[abstract]
    executor_pb2_grpc.add_ExecutorServiceServicer_to_server(ScriptedExecutor(), server)  # type: ignore[abstract]
    server.start()
    yield address
    server.stop(0)


def test_sync_face_raises_only_orchard_errors(scripted: str) -> None:
    with pytest.raises(orchard.AuthenticationError) as auth:
        orchard.Sandbox.list(endpoint=scripted, api_key="k")
    assert not isinstance(auth.value, grpc.RpcError) and auth.value.__cause__ is None
    sb = orchard.Sandbox.create(endpoint=scripted, api_key="k")
    with pytest.raises(orchard.CommandStartError, match="nosuchcmd"):
        sb.exec(["nosuchcmd"])
    with pytest.raises(orchard.InfrastructureError, match="disk on fire") as infra:
        sb.read_file("/x")
    assert infra.value.is_infrastructure


def test_async_face_raises_only_orchard_errors(scripted: str) -> None:
    async def scenario() -> None:
        with pytest.raises(orchard.AuthenticationError):
            await orchard.AsyncSandbox.list(endpoint=scripted, api_key="k")
        sb = await orchard.AsyncSandbox.create(endpoint=scripted, api_key="k")
        with pytest.raises(orchard.CommandStartError):
            await sb.exec("nosuchcmd")
        with pytest.raises(orchard.InfrastructureError):
            await sb.read_file("/x")

    asyncio.run(scenario())


def test_unreachable_endpoint_is_service_unavailable() -> None:
    with pytest.raises(orchard.ServiceUnavailableError) as info:
        orchard.Sandbox.list(endpoint="127.0.0.1:9", api_key="k")
    assert info.value.is_infrastructure
