"""The SDK's exception tree. No ``grpc.RpcError`` ever reaches a caller.

::

    OrchardError                       root: everything the SDK raises
    ├── ConfigurationError             no endpoint / API key could be found
    ├── AuthenticationError            API key or data-plane token refused
    ├── PermissionDeniedError          authenticated, but not allowed (also a PermissionError)
    ├── InvalidRequestError            the request is wrong; fix it, do not retry
    │   ├── ImageNotFoundError         no such image
    │   ├── PathError                  a path inside the sandbox is unusable
    │   │   ├── PathNotFoundError      (also a FileNotFoundError)
    │   │   ├── PathExistsError        (also a FileExistsError)
    │   │   ├── PathIsADirectoryError  (also an IsADirectoryError)
    │   │   ├── PathNotADirectoryError (also a NotADirectoryError)
    │   │   └── PathEscapeError        it leaves the sandbox (.., symlinks)
    │   └── CommandStartError          executable or user not found
    ├── SandboxError                   about one sandbox's state
    │   ├── SandboxNotFoundError
    │   ├── SandboxNotReadyError
    │   ├── SessionError               session unknown, busy or dead
    │   ├── SandboxLimitError          the sandbox hit its own pids/memory limit
    │   ├── ProcessError               background process unknown, or not in a state for that
    │   └── PortNotListeningError      nothing accepts on that port inside (also a
    │                                  builtins.ConnectionRefusedError)
    ├── QuotaExceededError             over a quota; ``retry_after`` seconds if known
    ├── DeadlineExceededError          a call ran out of time (also a builtins.TimeoutError)
    └── InfrastructureError            the platform failed, not the task: trainers
        └── ServiceUnavailableError    drop the sample; endpoint unreachable / down

Every error carries ``code`` (the gRPC status name, e.g. ``"NOT_FOUND"``),
``reason`` (an ``ErrorReason`` name from common.proto or ``""``) and ``fault``
(``"client"``, ``"task"`` or ``"infrastructure"``). A command that runs and
fails is not an exception: it is an ``ExecResult`` with its exit code.

Errors about paths, permissions and deadlines are also the matching Python
built-ins (``except FileNotFoundError`` catches a missing sandbox path, as it
would a missing local one; ``errno`` is set), so code written against
``pathlib`` / ``os`` keeps working. The cost: ``except OSError`` now catches
those SDK errors too, which is what such code means.
"""

from __future__ import annotations

import errno
from typing import Any

import grpc

REASON_KEY = "orchard-reason"
FAULT_KEY = "orchard-fault"
RETRY_AFTER_KEY = "retry-after"


class OrchardError(Exception):
    """Root of every error the SDK raises."""

    def __init__(
        self, message: str, *, code: str = "", reason: str = "", fault: str = "client"
    ) -> None:
        super().__init__(message)
        self.message = message
        self.code = code
        self.reason = reason
        self.fault = fault

    @property
    def is_infrastructure(self) -> bool:
        """True when the platform, not the task or the request, is to blame."""
        return self.fault == "infrastructure"


class ConfigurationError(OrchardError):
    """The SDK could not find where or how to connect."""


class AuthenticationError(OrchardError):
    """The API key (control plane) or the sandbox token (data plane) was refused."""


class _BuiltinOSError(OrchardError, OSError):
    """Mixin base: an SDK error that is also a ``builtins.OSError`` subclass.

    The subclass names its ``errno``; ``str()`` stays the server's message.
    """

    errno_code = 0

    def __init__(self, message: str, **kw: Any) -> None:
        super().__init__(message, **kw)
        self.errno = self.errno_code
        self.strerror = message

    def __str__(self) -> str:
        return self.message  # not OSError's "[Errno N] ...": the same text as every SDK error


class PermissionDeniedError(_BuiltinOSError, PermissionError):
    """The caller is known but may not do this (also a ``PermissionError``)."""

    errno_code = errno.EACCES


class InvalidRequestError(OrchardError):
    """The request is malformed or not supported; retrying it unchanged will fail again."""


class ImageNotFoundError(InvalidRequestError):
    """The image named in a create request does not exist."""


class PathError(InvalidRequestError):
    """A path inside the sandbox cannot be used for this operation."""


class PathNotFoundError(PathError, _BuiltinOSError, FileNotFoundError):
    """The path does not exist (also a ``FileNotFoundError``)."""

    errno_code = errno.ENOENT


class PathExistsError(PathError, _BuiltinOSError, FileExistsError):
    """Something is already at the path (also a ``FileExistsError``)."""

    errno_code = errno.EEXIST


class PathIsADirectoryError(PathError, _BuiltinOSError, IsADirectoryError):
    """The path is a directory where a file was needed (also an ``IsADirectoryError``)."""

    errno_code = errno.EISDIR


class PathNotADirectoryError(PathError, _BuiltinOSError, NotADirectoryError):
    """A directory was needed but the path (or a parent) is not one
    (also a ``NotADirectoryError``)."""

    errno_code = errno.ENOTDIR


class PathEscapeError(PathError):
    """The path (or an archive member) would leave its root."""


class CommandStartError(InvalidRequestError):
    """The command could not start (executable or user not found)."""


class SandboxError(OrchardError):
    """A problem with a sandbox's existence or state."""


class SandboxNotFoundError(SandboxError):
    """No such sandbox (or it belongs to another tenant)."""


class SandboxNotReadyError(SandboxError):
    """The sandbox exists but cannot serve this call in its state."""


class SessionError(SandboxError):
    """A shell session is unknown, busy or dead."""


class ProcessError(SandboxError):
    """A background process is unknown (or forgotten), or cannot take that call now."""


class SandboxLimitError(SandboxError):
    """The sandbox hit one of its own limits (pids, memory): the task's fault, not the platform's."""


class PortNotListeningError(SandboxError, ConnectionRefusedError):
    """A forwarded connection found nothing accepting on that port inside the sandbox.

    Also a ``ConnectionRefusedError``, so code written for local sockets catches it."""


class QuotaExceededError(OrchardError):
    """Over a quota; ``retry_after`` is the server's hint in seconds, if any."""

    def __init__(self, message: str, *, retry_after: float | None = None, **kw: Any) -> None:
        super().__init__(message, **kw)
        self.retry_after = retry_after


class DeadlineExceededError(OrchardError, TimeoutError):
    """A call did not finish before its deadline."""


class InfrastructureError(OrchardError):
    """The platform failed (backend, executor, network): not the task's fault."""


class ServiceUnavailableError(InfrastructureError):
    """The endpoint could not be reached or is shutting down."""


class ToolsLayerNotBuiltError(InfrastructureError):
    """``create(tools=...)`` asked for a tools layer the node has not built (the message
    names the build command, ``make tools-layer``)."""


_BY_REASON: dict[str, type[OrchardError]] = {
    "SANDBOX_NOT_FOUND": SandboxNotFoundError,
    "SANDBOX_NOT_READY": SandboxNotReadyError,
    "IMAGE_NOT_FOUND": ImageNotFoundError,
    "INVALID_FIELD": InvalidRequestError,
    "PATH_ESCAPE": PathEscapeError,
    "PATH_NOT_FOUND": PathNotFoundError,
    "NOT_A_DIRECTORY": PathNotADirectoryError,
    "IS_A_DIRECTORY": PathIsADirectoryError,
    "UNSUPPORTED_FILE_TYPE": PathError,
    "FILE_EXISTS": PathExistsError,
    "SESSION_NOT_FOUND": SessionError,
    "SESSION_BUSY": SessionError,
    "SESSION_DEAD": SessionError,
    "PROCESS_NOT_FOUND": ProcessError,
    "PROCESS_STATE": ProcessError,
    "TOKEN_INVALID": AuthenticationError,
    "API_KEY_INVALID": AuthenticationError,
    "QUOTA_EXCEEDED": QuotaExceededError,
    "BACKEND_FAILURE": InfrastructureError,
    "EXECUTABLE_NOT_FOUND": CommandStartError,
    "USER_NOT_FOUND": CommandStartError,
    "SANDBOX_RESOURCE_LIMIT": SandboxLimitError,
    "PORT_NOT_LISTENING": PortNotListeningError,
    "TOOLS_LAYER_NOT_BUILT": ToolsLayerNotBuiltError,
}

_BY_CODE: dict[grpc.StatusCode, type[OrchardError]] = {
    grpc.StatusCode.UNAUTHENTICATED: AuthenticationError,
    grpc.StatusCode.PERMISSION_DENIED: PermissionDeniedError,
    grpc.StatusCode.INVALID_ARGUMENT: InvalidRequestError,
    grpc.StatusCode.FAILED_PRECONDITION: InvalidRequestError,
    grpc.StatusCode.OUT_OF_RANGE: InvalidRequestError,
    grpc.StatusCode.UNIMPLEMENTED: InvalidRequestError,
    grpc.StatusCode.ALREADY_EXISTS: InvalidRequestError,
    grpc.StatusCode.NOT_FOUND: SandboxNotFoundError,
    grpc.StatusCode.RESOURCE_EXHAUSTED: QuotaExceededError,
    grpc.StatusCode.DEADLINE_EXCEEDED: DeadlineExceededError,
    grpc.StatusCode.UNAVAILABLE: ServiceUnavailableError,
    grpc.StatusCode.INTERNAL: InfrastructureError,
    grpc.StatusCode.UNKNOWN: InfrastructureError,
    grpc.StatusCode.DATA_LOSS: InfrastructureError,
    grpc.StatusCode.ABORTED: InfrastructureError,
    grpc.StatusCode.CANCELLED: InfrastructureError,
}

_INFRA_CODES = {
    grpc.StatusCode.UNAVAILABLE,
    grpc.StatusCode.INTERNAL,
    grpc.StatusCode.UNKNOWN,
    grpc.StatusCode.DATA_LOSS,
    grpc.StatusCode.ABORTED,
    grpc.StatusCode.CANCELLED,
}


def error_from_status(code: grpc.StatusCode, details: str, metadata: Any = ()) -> OrchardError:
    """The SDK error for a status code, message and trailing metadata (pure: no I/O)."""
    trailers = {str(k).lower(): str(v) for k, v in (metadata or ())}
    reason = trailers.get(REASON_KEY, "")
    fault = trailers.get(FAULT_KEY) or ("infrastructure" if code in _INFRA_CODES else "client")
    if code == grpc.StatusCode.DEADLINE_EXCEEDED:
        cls: type[OrchardError] = DeadlineExceededError
    elif reason in _BY_REASON:
        cls = _BY_REASON[reason]
    elif fault == "infrastructure":
        cls = (
            ServiceUnavailableError if code == grpc.StatusCode.UNAVAILABLE else InfrastructureError
        )
    else:
        cls = _BY_CODE.get(code, OrchardError)
    if fault == "infrastructure" and not issubclass(
        cls, (InfrastructureError, DeadlineExceededError)
    ):
        cls = InfrastructureError
    message = details or code.name.lower().replace("_", " ")
    kwargs: dict[str, Any] = {"code": code.name, "reason": reason, "fault": fault}
    if cls is QuotaExceededError:
        retry = trailers.get(RETRY_AFTER_KEY)
        try:
            kwargs["retry_after"] = float(retry) if retry else None
        except ValueError:
            kwargs["retry_after"] = None
    return cls(message, **kwargs)


def from_rpc_error(err: grpc.RpcError) -> OrchardError:
    """Translate a grpc (sync or aio) error; the one place RpcError is looked at."""
    code_fn = getattr(err, "code", None)
    code = code_fn() if callable(code_fn) else grpc.StatusCode.UNKNOWN
    details_fn = getattr(err, "details", None)
    details = (details_fn() if callable(details_fn) else "") or ""
    trailers_fn = getattr(err, "trailing_metadata", None)
    metadata = trailers_fn() if callable(trailers_fn) else ()
    return error_from_status(code or grpc.StatusCode.UNKNOWN, str(details), metadata)
