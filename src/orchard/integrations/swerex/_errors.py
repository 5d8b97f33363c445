"""Orchard's errors as SWE-ReX callers catch them.

SWE-ReX code catches builtins for files (``FileNotFoundError`` ...), its own
``CommandTimeoutError`` and session errors, and treats any other
``RuntimeError`` as the environment failing. SWE-ReX has no "sandbox
unavailable" exception of its own, so that one is ours, in its tree:
:class:`OrchardUnavailableError` (a ``SwerexException`` and a
``RuntimeError``), raised for a lost or failed sandbox and platform errors.
"""

from __future__ import annotations

from contextlib import AbstractContextManager

from swerex.exceptions import (
    CommandTimeoutError,
    SessionDoesNotExistError,
    SessionNotInitializedError,
    SwerexException,
)

import orchard

from .._errors import UNAVAILABLE, file_error, reraised


class OrchardUnavailableError(SwerexException, RuntimeError):
    """The Orchard sandbox behind the runtime is gone or the platform failed
    (not the command's doing: drop the episode, do not blame the agent)."""


def swerex_error(err: orchard.OrchardError, path: str | None = None) -> Exception:
    if isinstance(err, orchard.DeadlineExceededError):
        return CommandTimeoutError(err.message)
    if (as_file := file_error(err, path)) is not None:
        return as_file
    if isinstance(err, orchard.SessionError) and err.reason == "SESSION_NOT_FOUND":
        return SessionDoesNotExistError(err.message)
    if isinstance(err, orchard.SessionError) and err.reason == "SESSION_DEAD":
        return SessionNotInitializedError(f"the session's shell has exited: {err.message}")
    if isinstance(err, UNAVAILABLE):
        return OrchardUnavailableError(f"the Orchard sandbox is unavailable: {err.message}")
    return err


def swerex_errors(path: str | None = None) -> AbstractContextManager[None]:
    return reraised(swerex_error, path)
