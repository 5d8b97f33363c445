"""Log parsers for non-Python runners: ``go test -v``, ``cargo test``, jest ``--verbose``.

Same semantics as the ``swebench`` 5.x parsers of the same names.
"""

from __future__ import annotations

import re

from ..status import StatusMap, TestStatus

_GO_RESULT = re.compile(r"^--- (PASS|FAIL|SKIP): (.+) \((.+)\)$")
_GO_WORDS = {"PASS": TestStatus.PASSED, "FAIL": TestStatus.FAILED, "SKIP": TestStatus.SKIPPED}


def parse_go_test(log: str) -> StatusMap:
    """``--- PASS: TestName (0.00s)`` lines (subtests keep their ``Parent/child`` names)."""
    statuses: StatusMap = {}
    for line in log.split("\n"):
        found = _GO_RESULT.match(line.strip())
        if found:
            statuses[found.group(2)] = _GO_WORDS[found.group(1)]
    return statuses


_CARGO_RESULT = re.compile(r"^test\s+(\S+)\s+\.\.\.\s+(\w+)$")


def parse_cargo(log: str) -> StatusMap:
    """``test path::name ... ok|FAILED`` lines (``ignored`` tests are not recorded, as in swebench)."""
    statuses: StatusMap = {}
    for line in log.split("\n"):
        found = _CARGO_RESULT.match(line.strip())
        if not found:
            continue
        name, outcome = found.groups()
        if outcome == "ok":
            statuses[name] = TestStatus.PASSED
        elif outcome == "FAILED":
            statuses[name] = TestStatus.FAILED
    return statuses


_JEST_RESULT = re.compile(r"^\s*(✓|✕|○)\s(.+?)(?:\s\((\d+\s*m?s)\))?$")
_JEST_MARKS = {"✓": TestStatus.PASSED, "✕": TestStatus.FAILED, "○": TestStatus.SKIPPED}


def parse_jest(log: str) -> StatusMap:
    """jest ``--verbose``: ``✓ name (3 ms)``, ``✕ name``, ``○ skipped name``."""
    statuses: StatusMap = {}
    for line in log.split("\n"):
        found = _JEST_RESULT.match(line.strip())
        if found:
            statuses[found.group(2).strip()] = _JEST_MARKS[found.group(1)]
    return statuses
