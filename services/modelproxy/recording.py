"""CallLog: a session's recorded model calls, bounded, appended to ``calls.jsonl``.

One record per distinct request: a call whose body (and API) is byte-for-byte the same as an
earlier one of the session is a retry (a harness's timeout, a client library's automatic
retry), so it replaces that record's answer (the answer the harness went on with) and counts
``retries``; it is not a second turn. Each change appends the whole record as one line; on
load the last line of an ``index`` wins, so a crash mid-write loses at most the line being
written (a torn last line is skipped and said in ``torn_lines``).

A record (all JSON)::

    index, api ("chat" | "responses" | "messages"), request (as the harness sent it),
    upstream_request (the Chat body sent upstream), response (the upstream's Chat answer,
    streamed chunks reassembled), client_response (what the harness got, when translated),
    prompt_token_ids, completion_token_ids, completion_logprobs (null where not returned),
    stream, status, error, model_version, started_at, first_token_ms, total_ms, retries,
    not_carried (hints a translation dropped), tool_names (a Responses translation's
    flattened namespace tools: Chat name -> ``{namespace, name}``)
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any, BinaryIO

from .errors import ProxyError


def answered(record: dict[str, Any]) -> bool:
    """Whether a call got an answer the harness could go on with (what samples are built of)."""
    return record.get("status") == 200 and bool(record.get("response"))


def request_digest(api: str, body: bytes) -> str:
    return hashlib.sha256(api.encode() + b"\0" + body).hexdigest()


class CallLog:
    def __init__(self, path: Path, max_calls: int, max_bytes: int) -> None:
        self.path = path
        self._records: list[dict[str, Any]] | None = []
        self._by_digest: dict[str, int] = {}
        self._max_calls, self._max_bytes = max_calls, max_bytes
        self.bytes = path.stat().st_size if path.exists() else 0
        self.torn_lines = 0
        self._count: int | None = None
        self._answered: int | None = None
        self._file: BinaryIO | None = None
        """Opened at the first write, closed by close(): a thousand idle sessions hold no fds."""

    @classmethod
    def load(cls, path: Path, max_calls: int, max_bytes: int, *, lazily: bool = False) -> CallLog:
        """The log on disk; ``lazily``: read only when its records are first asked for (a
        finished session's, so a restart does not hold every rollout ever recorded)."""
        log = cls(path, max_calls, max_bytes)
        log._records = None
        if not lazily:
            log._read()
        return log

    def _read(self) -> list[dict[str, Any]]:
        by_index: dict[int, dict[str, Any]] = {}
        self.torn_lines = 0
        if self.path.exists():
            with open(self.path, "rb") as f:
                for line in f:
                    try:
                        record = json.loads(line)
                        by_index[int(record["index"])] = record
                    except (ValueError, KeyError, TypeError):
                        self.torn_lines += 1
        records = [by_index[i] for i in sorted(by_index)]
        self._by_digest = {r["digest"]: i for i, r in enumerate(records)}
        self._records = records
        return records

    @property
    def records(self) -> list[dict[str, Any]]:
        return self._records if self._records is not None else self._read()

    @property
    def count(self) -> int:
        if self._records is not None:
            return len(self._records)
        if self._count is None:
            self._count = len(self._read())
            self.release()
        return self._count

    @property
    def answered(self) -> int:
        """How many records got an answer (:func:`answered`); the rest failed."""
        if self._records is not None:
            return sum(1 for r in self._records if answered(r))
        if self._answered is None:
            self._answered = sum(1 for r in self._read() if answered(r))
            self.release()
        return self._answered

    def release(self) -> None:
        """Drop the records from memory (a finished session's: they are all on disk)."""
        if self._file is None and self._records is not None:
            self._count = len(self._records)
            self._answered = sum(1 for r in self._records if answered(r))
            self._records, self._by_digest = None, {}

    def admit(self) -> None:
        """Refuse a new call when the session's record is full (429, nothing half-recorded)."""
        if len(self.records) >= self._max_calls:
            raise ProxyError(429, "SESSION_FULL", f"session holds {self._max_calls} calls")
        if self.bytes >= self._max_bytes:
            raise ProxyError(429, "SESSION_FULL", f"session holds {self._max_bytes} bytes")

    def retry_of(self, digest: str) -> dict[str, Any] | None:
        index = self._by_digest.get(digest)
        return None if index is None else self.records[index]

    def put(self, record: dict[str, Any]) -> dict[str, Any]:
        """Record a finished call (a retry replaces its original, keeping its index)."""
        earlier = self.retry_of(record["digest"])
        if earlier is not None:
            record["index"] = earlier["index"]
            record["retries"] = earlier.get("retries", 0) + 1
            self.records[earlier["index"]] = record
        else:
            record["index"] = len(self.records)
            record["retries"] = 0
            self._by_digest[record["digest"]] = record["index"]
            self.records.append(record)
        line = json.dumps(record, separators=(",", ":")).encode() + b"\n"
        if self._file is None:
            self._file = open(self.path, "ab")  # noqa: SIM115 (closed by close())
        self._file.write(line)
        self._file.flush()
        self.bytes += len(line)
        return record

    def sync(self) -> None:
        if self._file is not None:
            self._file.flush()
            os.fsync(self._file.fileno())

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
