"""What every adapter's error map shares: file errors as the built-ins, and "unavailable".

Each host project names timeouts, sessions and a lost sandbox its own way
(``inspect/_errors.py``, ``swerex/_errors.py``), but file-API callers all catch
the plain built-ins, naming the path as ``open()`` would, and all treat the
same Orchard errors as the platform failing rather than the agent.
"""

from __future__ import annotations

import errno
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import orchard

UNAVAILABLE: tuple[type[orchard.OrchardError], ...] = (
    orchard.InfrastructureError,
    orchard.SandboxNotFoundError,
    orchard.SandboxNotReadyError,
)
"""Errors that are the platform's doing (a lost executor, a deleted or failed sandbox)."""


def file_error(err: orchard.OrchardError, path: str | None) -> OSError | None:
    """The built-in a file-API caller expects for ``err`` about ``path``, or None."""
    name = path or ""
    if isinstance(err, orchard.PathNotFoundError):
        return FileNotFoundError(errno.ENOENT, "No such file or directory", name)
    if isinstance(err, orchard.PathError) and err.reason == "IS_A_DIRECTORY":
        return IsADirectoryError(errno.EISDIR, "Is a directory", name)
    if isinstance(err, orchard.PathError) and err.reason == "NOT_A_DIRECTORY":
        return NotADirectoryError(errno.ENOTDIR, "Not a directory", name)
    if isinstance(err, orchard.PermissionDeniedError) and path is not None:
        return PermissionError(errno.EACCES, "Permission denied", name)
    return None


@contextmanager
def reraised(
    mapper: Callable[[orchard.OrchardError, str | None], Exception], path: str | None = None
) -> Iterator[None]:
    """Re-raise Orchard errors from the block as ``mapper`` says (unchanged when it returns them)."""
    try:
        yield
    except orchard.OrchardError as err:
        mapped = mapper(err, path)
        if mapped is err:
            raise
        raise mapped from err
