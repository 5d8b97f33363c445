"""Orchard's errors as Inspect's sandbox contract names them.

Inspect's callers catch builtins (``FileNotFoundError``, ``IsADirectoryError``,
``PermissionError``, ``TimeoutError``) and its own ``SandboxUnavailableError``
(a tool call turns that into a ``sandbox_unavailable`` tool error and the
sample goes on). Everything the platform did wrong (a lost executor, a deleted
or failed sandbox) is "unavailable"; request errors stay ``orchard`` errors,
because they are the caller's to fix. Translated once, here.
"""

from __future__ import annotations

import errno
from collections.abc import Iterator
from contextlib import contextmanager

from inspect_ai.util import SandboxUnavailableError

import orchard


def inspect_error(err: orchard.OrchardError, path: str | None = None) -> Exception:
    """The exception Inspect expects for ``err`` (``path``: the file it was about)."""
    name = path if path is not None else ""
    if isinstance(err, orchard.DeadlineExceededError):
        return TimeoutError(err.message)
    if isinstance(err, orchard.PathNotFoundError):
        return FileNotFoundError(errno.ENOENT, "No such file or directory", name)
    if isinstance(err, orchard.PathError) and err.reason == "IS_A_DIRECTORY":
        return IsADirectoryError(errno.EISDIR, "Is a directory", name)
    if isinstance(err, orchard.PathError) and err.reason == "NOT_A_DIRECTORY":
        return NotADirectoryError(errno.ENOTDIR, "Not a directory", name)
    if isinstance(err, orchard.PermissionDeniedError) and path is not None:
        return PermissionError(errno.EACCES, "Permission denied", name)
    if isinstance(
        err,
        (orchard.InfrastructureError, orchard.SandboxNotFoundError, orchard.SandboxNotReadyError),
    ):
        return SandboxUnavailableError(f"the Orchard sandbox is unavailable: {err.message}")
    return err


@contextmanager
def inspect_errors(path: str | None = None) -> Iterator[None]:
    """Re-raise Orchard errors from the block as :func:`inspect_error` says."""
    try:
        yield
    except orchard.OrchardError as err:
        mapped = inspect_error(err, path)
        if mapped is err:
            raise
        raise mapped from err
