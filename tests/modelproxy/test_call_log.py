"""CallLog on disk: retries replace their original, a torn last line is skipped and counted,
and a full session refuses more calls."""

from __future__ import annotations

from pathlib import Path

import pytest
from orchard.modelproxy.errors import ProxyError
from orchard.modelproxy.recording import CallLog, request_digest


def test_reload_keeps_the_last_version_and_skips_a_torn_line(tmp_path: Path) -> None:
    log = CallLog(tmp_path / "calls.jsonl", 10, 1 << 20)
    log.put({"digest": request_digest("chat", b"a"), "status": 503})
    log.put({"digest": request_digest("chat", b"b"), "status": 200})
    log.put({"digest": request_digest("chat", b"a"), "status": 200})
    log.sync()
    log.close()
    with open(tmp_path / "calls.jsonl", "ab") as f:
        f.write(b'{"index": 2, "digest": "x", "stat')  # a crash mid-write
    again = CallLog.load(tmp_path / "calls.jsonl", 10, 1 << 20)
    assert [(r["index"], r["status"], r["retries"]) for r in again.records] == [
        (0, 200, 1),
        (1, 200, 0),
    ]
    assert again.torn_lines == 1
    assert again.retry_of(request_digest("chat", b"a")) is again.records[0]
    again.close()


def test_a_full_session_refuses_more_calls(tmp_path: Path) -> None:
    log = CallLog(tmp_path / "calls.jsonl", 2, 1 << 20)
    for body in (b"1", b"2"):
        log.admit()
        log.put({"digest": request_digest("chat", body)})
    with pytest.raises(ProxyError) as err:
        log.admit()
    assert err.value.status == 429 and err.value.code == "SESSION_FULL"
    log.close()


def test_a_finished_sessions_records_leave_memory_and_come_back_from_disk(tmp_path: Path) -> None:
    log = CallLog(tmp_path / "calls.jsonl", 10, 1 << 20)
    log.put({"digest": request_digest("chat", b"a"), "status": 200})
    log.sync()
    log.close()
    log.release()
    assert log._records is None and log.count == 1
    assert [r["status"] for r in log.records] == [200]
    lazy = CallLog.load(tmp_path / "calls.jsonl", 10, 1 << 20, lazily=True)
    assert lazy._records is None and lazy.count == 1 and lazy._records is None
    assert lazy.records[0]["index"] == 0
