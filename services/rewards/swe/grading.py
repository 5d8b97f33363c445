"""Grading a test log the way ``swebench`` 5.x does (``get_logs_eval`` + ``get_eval_report``).

Semantics, kept identical so verdicts match on the same logs (checked by
``tests/rewards/test_parity.py`` against the installed ``swebench`` package):

- A log containing one of the harness's failure markers (patch apply failed,
  reset failed, tests errored, tests timed out), or lacking either test-output
  marker, is not gradable.
- The parser reads the text between the first start marker and the next end
  marker; if it finds nothing there it reads the whole log.
- An empty result with no evidence that a suite ran is not gradable (a suite
  that never started is not a pass).
- A run whose recorded exit code is non-zero while the log reports no failure
  or error at all is not gradable (the log does not describe the run).
- FAIL_TO_PASS: PASSED/XFAIL pass; FAILED/ERROR/SKIPPED/missing fail (a skipped
  F2P test is a failure). PASS_TO_PASS: SKIPPED also counts as maintained.
- An expected id with more ``[`` than ``]`` (truncated parametrised id) matches
  logged ids by prefix when all matches agree on pass vs fail.
- Resolved = FULL: every F2P and every P2P test passed (an empty list counts as 1.0).

Unlike ``swebench`` we also say *why* a log is not gradable (``LogVerdict.reason``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from enum import StrEnum

from .parsers import get_parser
from .status import StatusMap, TestStatus

START_MARKER = ">>>>> Start Test Output"
END_MARKER = ">>>>> End Test Output"
EXIT_CODE_MARKER = ">>>>> Test Exit Code"
APPLY_FAILED_MARKER = ">>>>> Patch Apply Failed"
RESET_FAILED_MARKER = ">>>>> Reset Failed"
TESTS_ERRORED_MARKER = ">>>>> Tests Errored"
TIMED_OUT_MARKER = ">>>>> Tests Timed Out"

_BAD_MARKERS = {
    APPLY_FAILED_MARKER: "patch_apply_failed",
    RESET_FAILED_MARKER: "reset_failed",
    TESTS_ERRORED_MARKER: "tests_errored",
    TIMED_OUT_MARKER: "tests_timed_out",
}

_EXIT_CODE = re.compile(rf"{re.escape(EXIT_CODE_MARKER)}:\s*(-?\d+)")

# Runner summaries that prove a suite executed at least one test (every count non-zero).
_SUITE_RAN = re.compile(
    "|".join(
        (
            r"Executed [1-9]\d* of \d+",  # karma
            r"TOTAL: [1-9]\d* (?:SUCCESS|FAILED)",  # karma summary
            r"[1-9]\d* passing",  # mocha
            r"Tests:\s+[1-9]\d*",  # jest
            r"Test Suites:\s+(?:\d+ \w+, )*[1-9]\d* total",  # jest
            r"^# tests [1-9]\d*",  # tap
            r"[1-9]\d* specs?, \d+ failures?",  # jasmine
            r"': ok$",  # openlayers' rendering harness
        )
    ),
    re.MULTILINE,
)


class EvalType(StrEnum):
    PASS_AND_FAIL = "pass_and_fail"
    FAIL_ONLY = "fail_only"
    """Only FAILED counts as failure; an absent test passes (runners that print failures only)."""


class Resolution(StrEnum):
    FULL = "RESOLVED_FULL"
    PARTIAL = "RESOLVED_PARTIAL"
    NO = "RESOLVED_NO"


@dataclass(frozen=True)
class LogVerdict:
    statuses: StatusMap
    gradable: bool
    reason: str = ""
    """Why not gradable: a marker's name, ``no_markers``, ``no_evidence`` or ``exit_code_mismatch``."""
    exit_code: int | None = None


def recorded_exit_code(log: str) -> int | None:
    found = _EXIT_CODE.search(log)
    return int(found.group(1)) if found else None


def read_log(log: str, parser_name: str) -> LogVerdict:
    """Parse a whole eval log and decide whether it can be graded at all."""
    parser = get_parser(parser_name)
    for marker, reason in _BAD_MARKERS.items():
        if marker in log:
            return LogVerdict({}, False, reason)
    if START_MARKER not in log or END_MARKER not in log:
        return LogVerdict({}, False, "no_markers")
    between = log.split(START_MARKER)[1].split(END_MARKER)[0]
    statuses = parser(between) or parser(log)
    exit_code = recorded_exit_code(log)
    if not statuses and not _SUITE_RAN.search(log):
        return LogVerdict({}, False, "no_evidence", exit_code)
    if (
        exit_code not in (None, 0)
        and statuses
        and not any(s in (TestStatus.FAILED, TestStatus.ERROR) for s in statuses.values())
    ):
        return LogVerdict({}, False, "exit_code_mismatch", exit_code)
    return LogVerdict(statuses, True, "", exit_code)


_PASSING = (TestStatus.PASSED.value, TestStatus.XFAIL.value)
_FAILING = (TestStatus.FAILED.value, TestStatus.ERROR.value, TestStatus.SKIPPED.value)


def resolve_test_id(test_id: str, statuses: StatusMap) -> str | None:
    """The logged id for ``test_id``: itself, or an unambiguous match of a truncated id."""
    if test_id in statuses:
        return test_id
    if test_id.count("[") > test_id.count("]"):
        matches = [k for k in statuses if k.startswith(test_id)]
        if matches and len({statuses[k] in _PASSING for k in matches}) == 1:
            return matches[0]
    return None


def test_passed(test_id: str, statuses: StatusMap) -> bool:
    key = resolve_test_id(test_id, statuses)
    return key is not None and statuses[key] in _PASSING


def test_maintained(test_id: str, statuses: StatusMap) -> bool:
    """PASS_TO_PASS: a skipped test is not a regression."""
    key = resolve_test_id(test_id, statuses)
    return test_passed(test_id, statuses) or (
        key is not None and statuses[key] == TestStatus.SKIPPED
    )


def test_failed(test_id: str, statuses: StatusMap) -> bool:
    key = resolve_test_id(test_id, statuses)
    return key is None or statuses[key] in _FAILING


@dataclass
class Outcomes:
    success: list[str] = field(default_factory=list)
    failure: list[str] = field(default_factory=list)

    @property
    def rate(self) -> float:
        """Share that passed; 1.0 for an empty list (as swebench counts it)."""
        total = len(self.success) + len(self.failure)
        return 1.0 if total == 0 else len(self.success) / total


@dataclass
class TestsReport:
    __test__ = False

    fail_to_pass: Outcomes
    pass_to_pass: Outcomes

    @property
    def resolution(self) -> Resolution:
        f2p, p2p = self.fail_to_pass.rate, self.pass_to_pass.rate
        if f2p == 1 and p2p == 1:
            return Resolution.FULL
        if 0 < f2p < 1 and p2p == 1:
            return Resolution.PARTIAL
        return Resolution.NO

    @property
    def resolved(self) -> bool:
        return self.resolution is Resolution.FULL


def _sort(ids: list[str], statuses: StatusMap, eval_type: EvalType, *, f2p: bool) -> Outcomes:
    out = Outcomes()
    for test_id in ids:
        if eval_type is EvalType.FAIL_ONLY:
            failed = statuses.get(test_id) == TestStatus.FAILED
            (out.failure if failed else out.success).append(test_id)
            continue
        ok = test_passed(test_id, statuses) if f2p else test_maintained(test_id, statuses)
        if ok:
            out.success.append(test_id)
        elif test_failed(test_id, statuses):
            out.failure.append(test_id)
        # else: a status word neither list knows (e.g. a mangled one): counted in neither, as swebench does
    return out


def grade_statuses(
    statuses: StatusMap,
    fail_to_pass: list[str],
    pass_to_pass: list[str],
    eval_type: EvalType = EvalType.PASS_AND_FAIL,
) -> TestsReport:
    return TestsReport(
        fail_to_pass=_sort(fail_to_pass, statuses, eval_type, f2p=True),
        pass_to_pass=_sort(pass_to_pass, statuses, eval_type, f2p=False),
    )
