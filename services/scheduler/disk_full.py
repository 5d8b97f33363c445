"""A full data directory, reported as RESOURCE_EXHAUSTED with a message that says so.

When the node's disk fills, the scheduler's writes fail in several places: the
SQLite store (``database or disk is full``), the backend's sandbox folder
(``ENOSPC``), runc's own state files (its stderr says ``no space left on
device``). Each used to leave as INTERNAL ("internal error") or UNAVAILABLE,
which tells a client nothing it can act on. This module recognises them all,
so a client sees RESOURCE_EXHAUSTED, reason DISK_FULL, fault infrastructure,
and an operator reading the message knows to free space.
"""

from __future__ import annotations

import errno
import sqlite3

import grpc

from orchard.common.errors import ServiceError

DISK_FULL = "DISK_FULL"
_FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT)
_FULL_MESSAGES = ("no space left on device", "database or disk is full", "disk quota exceeded")


def says_disk_full(text: str) -> bool:
    """Whether an error message (ours, SQLite's, runc's) means the disk is full."""
    lowered = text.lower()
    return any(m in lowered for m in _FULL_MESSAGES)


def is_disk_full(exc: BaseException) -> bool:
    """Whether ``exc`` (or what caused it) is a full disk."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, OSError) and current.errno in _FULL_ERRNOS:
            return True
        if isinstance(current, sqlite3.Error) and says_disk_full(str(current)):
            return True
        current = current.__cause__ or current.__context__
    return False


def disk_full_error(detail: str) -> ServiceError:
    return ServiceError(
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        DISK_FULL,
        f"the node's data directory is full (no space left on device); free space and retry: "
        f"{detail}"[:1000],
        "infrastructure",
    )


def disk_full_status(exc: Exception) -> ServiceError | None:
    """The scheduler's ``translate`` at the service edge: a full disk, or None."""
    return disk_full_error(str(exc)) if is_disk_full(exc) else None
