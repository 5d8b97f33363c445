"""Reading a dataset file (JSONL, a JSON array, Parquet) into validated :class:`SweTask` s.

Every row is checked; the first bad one stops the load with a :class:`TaskRowError` that
names the file, the row (1-based: the line of a JSONL file, the record of a JSON array or a
Parquet file) and the field, so a broken export is fixed at its source rather than skipped.
Parquet is read batch by batch with pyarrow (the Hub's format; ``orchard-env[swe]``).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from ._formats import FORMATS
from ._images import check_reference
from ._task import SweTask

PARQUET_BATCH_ROWS = 256


class TaskRowError(ValueError):
    """A row that is not a valid task of its format: ``path``, ``row``, ``field``, ``reason``."""

    def __init__(self, path: Path, row: int, field: str, reason: str) -> None:
        self.path, self.row, self.field, self.reason = path, row, field, reason
        super().__init__(f"{path}: row {row}: {field}: {reason}")


def _jsonl(path: Path) -> Iterator[tuple[int, Any]]:
    with path.open("rb") as f:
        for number, raw in enumerate(f, start=1):
            if not raw.strip():
                continue
            try:
                yield number, json.loads(raw)
            except (json.JSONDecodeError, UnicodeDecodeError) as exc:
                raise TaskRowError(path, number, "(row)", f"not valid JSON ({exc})") from None


def _json_array(path: Path) -> Iterator[tuple[int, Any]]:
    try:
        data = json.loads(path.read_bytes())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise TaskRowError(path, 0, "(file)", f"not valid JSON ({exc})") from None
    if not isinstance(data, list):
        raise TaskRowError(path, 0, "(file)", "a .json dataset must be an array of rows")
    yield from enumerate(data, start=1)


def _parquet(path: Path) -> Iterator[tuple[int, Any]]:
    try:
        import pyarrow.parquet as pq
    except ImportError:  # pragma: no cover - the swe extra installs it
        raise TaskRowError(
            path, 0, "(file)", "reading Parquet needs pyarrow: pip install 'orchard-env[swe]'"
        ) from None
    try:
        reader = pq.ParquetFile(path)
    except Exception as exc:  # pyarrow raises ArrowInvalid / OSError for a broken file
        raise TaskRowError(path, 0, "(file)", f"not a readable Parquet file ({exc})") from None
    number = 0
    for batch in reader.iter_batches(batch_size=PARQUET_BATCH_ROWS):
        for record in batch.to_pylist():
            number += 1
            yield number, record


def read_rows(path: str | Path) -> Iterator[tuple[int, Any]]:
    """(row number, raw row) from ``.jsonl`` / ``.json`` / ``.parquet``."""
    path = Path(path)
    suffix = path.suffix.lower()
    if suffix in (".jsonl", ".ndjson"):
        return _jsonl(path)
    if suffix == ".json":
        return _json_array(path)
    if suffix == ".parquet":
        return _parquet(path)
    raise TaskRowError(path, 0, "(file)", "unknown file type: .jsonl, .json or .parquet")


def _field(error: dict[str, Any]) -> str:
    return ".".join(str(part) for part in error["loc"]) or "(row)"


def parse_row(
    raw: Any, format: str, *, path: Path, row: int, test_cmd: str | None = None
) -> SweTask:
    """One raw row (a mapping) as a task of ``format``; :class:`TaskRowError` if it is not."""
    spec = FORMATS[format]
    if not isinstance(raw, dict):
        raise TaskRowError(path, row, "(row)", f"must be an object, not {type(raw).__name__}")
    try:
        model = spec.model.model_validate(raw)
    except ValidationError as exc:
        first = exc.errors()[0]
        more = f" (and {exc.error_count() - 1} more)" if exc.error_count() > 1 else ""
        raise TaskRowError(path, row, _field(dict(first)), first["msg"] + more) from None
    try:
        task = spec.normalize(model, test_cmd)
    except ValueError as exc:
        field, _, reason = str(exc).partition(": ")
        raise TaskRowError(path, row, field, reason) from None
    problem = check_reference(task.image)
    if problem:
        raise TaskRowError(path, row, spec.image_field or "instance_id (image name)", problem)
    return task


def iter_tasks(path: str | Path, format: str, *, test_cmd: str | None = None) -> Iterator[SweTask]:
    """The tasks of a dataset file, validated row by row (ids must be unique).

    ``format``: one of :data:`FORMATS` (``swe-bench``, ``swe-bench-verified``, ``swe-gym``,
    ``swe-rebench``, ``swe-rebench-v2``, ``scale-swe``, ``orchard``). ``test_cmd``: a command
    template for rows that carry none (``{test_files}`` = the test patch's files), e.g.
    ``"python -m pytest -rA {test_files}"``; it replaces a row's own command when given.
    """
    if format not in FORMATS:
        raise ValueError(f"unknown dataset format {format!r}: one of {sorted(FORMATS)}")
    path = Path(path)
    seen: dict[str, int] = {}
    for number, raw in read_rows(path):
        task = parse_row(raw, format, path=path, row=number, test_cmd=test_cmd)
        if task.instance_id in seen:
            raise TaskRowError(
                path,
                number,
                "instance_id",
                f"{task.instance_id!r} repeats row {seen[task.instance_id]}",
            )
        seen[task.instance_id] = number
        yield task


def load_tasks(path: str | Path, format: str, *, test_cmd: str | None = None) -> list[SweTask]:
    """:func:`iter_tasks` as a list."""
    return list(iter_tasks(path, format, test_cmd=test_cmd))
