"""Orchard's errors as Inspect's sandbox contract names them.

Inspect's callers catch builtins (``FileNotFoundError``, ``IsADirectoryError``,
``PermissionError``, ``TimeoutError``) and its own ``SandboxUnavailableError``
(a tool call turns that into a ``sandbox_unavailable`` tool error and the
sample goes on). Everything the platform did wrong (a lost executor, a deleted
or failed sandbox) is "unavailable"; request errors stay ``orchard`` errors,
because they are the caller's to fix. Translated once, here.
"""

from __future__ import annotations

from contextlib import AbstractContextManager

from inspect_ai.util import SandboxUnavailableError

import orchard

from .._errors import UNAVAILABLE, file_error, reraised


def inspect_error(err: orchard.OrchardError, path: str | None = None) -> Exception:
    """The exception Inspect expects for ``err`` (``path``: the file it was about)."""
    if isinstance(err, orchard.DeadlineExceededError):
        return TimeoutError(err.message)
    if (as_file := file_error(err, path)) is not None:
        return as_file
    if isinstance(err, UNAVAILABLE):
        return SandboxUnavailableError(f"the Orchard sandbox is unavailable: {err.message}")
    return err


def inspect_errors(path: str | None = None) -> AbstractContextManager[None]:
    """Re-raise Orchard errors from the block as :func:`inspect_error` says."""
    return reraised(inspect_error, path)
