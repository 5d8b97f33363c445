"""Per-test statuses, with the same spellings as ``swebench`` (logs and reports compare as strings)."""

from __future__ import annotations

from enum import StrEnum


class TestStatus(StrEnum):
    __test__ = False  # not a pytest test class

    FAILED = "FAILED"
    PASSED = "PASSED"
    SKIPPED = "SKIPPED"
    ERROR = "ERROR"
    XFAIL = "XFAIL"


STATUS_WORDS: tuple[str, ...] = tuple(s.value for s in TestStatus)
"""In ``swebench``'s order; parsers test ``line.startswith`` against each."""

StatusMap = dict[str, str]
"""test id -> status word. A str, not the enum: a parser keeps the word it read
(``swebench`` does too, and grading must see the same map)."""
