"""The ListDir / Stat / MakeDir contract both executors answer by: bounds and file types.

The node executor (``services/executor/files``) and the ``orchard.testing`` fake
must refuse and describe exactly alike (``tests/e2e/test_fake_parity.py``), so
the numbers and the ``st_mode`` -> ``FileType`` mapping live here once, beside
``exec_limits`` which plays the same part for exec.
"""

from __future__ import annotations

import stat
from collections.abc import Callable

from orchard._proto.orchard.v1 import executor_pb2 as pb

MAX_DEPTH = 64
DEFAULT_MAX_ENTRIES = 10_000
MAX_ENTRIES = 100_000
DEFAULT_DIR_MODE = 0o755

_TYPES: tuple[tuple[Callable[[int], bool], pb.FileType.ValueType], ...] = (
    (stat.S_ISREG, pb.FILE_TYPE_FILE),
    (stat.S_ISDIR, pb.FILE_TYPE_DIRECTORY),
    (stat.S_ISLNK, pb.FILE_TYPE_SYMLINK),
    (stat.S_ISFIFO, pb.FILE_TYPE_FIFO),
    (stat.S_ISSOCK, pb.FILE_TYPE_SOCKET),
    (stat.S_ISCHR, pb.FILE_TYPE_CHAR_DEVICE),
    (stat.S_ISBLK, pb.FILE_TYPE_BLOCK_DEVICE),
)


def file_type(mode: int) -> pb.FileType.ValueType:
    """The FileType of an ``st_mode``."""
    return next((kind for test, kind in _TYPES if test(mode)), pb.FILE_TYPE_UNSPECIFIED)


def listing_bounds(depth: int, max_entries: int) -> tuple[int, int, str | None]:
    """(depth, max_entries) with defaults applied, and the INVALID_ARGUMENT message if beyond."""
    depth = depth or 1
    max_entries = max_entries or DEFAULT_MAX_ENTRIES
    if depth > MAX_DEPTH:
        return depth, max_entries, f"depth {depth} is more than {MAX_DEPTH} levels"
    if max_entries > MAX_ENTRIES:
        return depth, max_entries, f"max_entries {max_entries} is more than {MAX_ENTRIES}"
    return depth, max_entries, None
