"""Orchard's errors as SWE-ReX callers catch them.

SWE-ReX code catches builtins for files (``FileNotFoundError`` ...), its own
``CommandTimeoutError`` and session errors, and treats any other
``RuntimeError`` as the environment failing. SWE-ReX has no "sandbox
unavailable" exception of its own, so that one is ours, in its tree:
:class:`OrchardUnavailableError` (a ``SwerexException`` and a
``RuntimeError``), raised for a lost or failed sandbox and platform errors.
"""

from __future__ import annotations

import errno
from collections.abc import Iterator
from contextlib import contextmanager

from swerex.exceptions import (
    CommandTimeoutError,
    SessionDoesNotExistError,
    SessionNotInitializedError,
    SwerexException,
)

import orchard


class OrchardUnavailableError(SwerexException, RuntimeError):
    """The Orchard sandbox behind the runtime is gone or the platform failed
    (not the command's doing: drop the episode, do not blame the agent)."""


def swerex_error(err: orchard.OrchardError, path: str | None = None) -> Exception:
    name = path or ""
    if isinstance(err, orchard.DeadlineExceededError):
        return CommandTimeoutError(err.message)
    if isinstance(err, orchard.PathNotFoundError):
        return FileNotFoundError(errno.ENOENT, "No such file or directory", name)
    if isinstance(err, orchard.PathError) and err.reason == "IS_A_DIRECTORY":
        return IsADirectoryError(errno.EISDIR, "Is a directory", name)
    if isinstance(err, orchard.PathError) and err.reason == "NOT_A_DIRECTORY":
        return NotADirectoryError(errno.ENOTDIR, "Not a directory", name)
    if isinstance(err, orchard.PermissionDeniedError) and path is not None:
        return PermissionError(errno.EACCES, "Permission denied", name)
    if isinstance(err, orchard.SessionError) and err.reason == "SESSION_NOT_FOUND":
        return SessionDoesNotExistError(err.message)
    if isinstance(err, orchard.SessionError) and err.reason == "SESSION_DEAD":
        return SessionNotInitializedError(f"the session's shell has exited: {err.message}")
    if isinstance(
        err,
        (orchard.InfrastructureError, orchard.SandboxNotFoundError, orchard.SandboxNotReadyError),
    ):
        return OrchardUnavailableError(f"the Orchard sandbox is unavailable: {err.message}")
    return err


@contextmanager
def swerex_errors(path: str | None = None) -> Iterator[None]:
    try:
        yield
    except orchard.OrchardError as err:
        mapped = swerex_error(err, path)
        if mapped is err:
            raise
        raise mapped from err
