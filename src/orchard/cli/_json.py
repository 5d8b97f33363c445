"""``--json``: what the listings and ``info`` print for scripts instead of a table.

One JSON object per line (JSON Lines), one line per row: ``orchard ls --json |
jq .id`` and ``while read`` loops work without reading the whole list first,
and ``tenant ls`` / ``token-key ls`` printed this shape before the others had
``--json``. An object is the SDK's dataclass as it is (``SandboxInfo``,
``ImageInfo``, ``PoolInfo``), field for field, so a script reads the same names
the Python API has; times are ISO 8601 in UTC, sizes in bytes.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import json
from collections.abc import Iterable
from typing import Any


def add_flag(parser: argparse.ArgumentParser | argparse._MutuallyExclusiveGroup) -> None:
    parser.add_argument(
        "--json", action="store_true", help="one JSON object per line instead of a table"
    )


def _plain(value: Any) -> Any:
    if isinstance(value, dt.datetime):
        return value.astimezone(dt.UTC).isoformat()
    raise TypeError(f"not JSON: {type(value).__name__}")


def line(obj: Any) -> str:
    """One dataclass (or mapping) as one JSON line."""
    is_instance = dataclasses.is_dataclass(obj) and not isinstance(obj, type)
    data = dataclasses.asdict(obj) if is_instance else obj
    return json.dumps(data, default=_plain)


def print_lines(objs: Iterable[Any]) -> None:
    for obj in objs:
        print(line(obj))
