"""The test runner's own completion record, checked against the per-test lines.

A log's per-test lines can be printed by anyone; the runner's closing record
is what only a run that reached its end writes, and it has to agree with those
lines. Per runner family:

- **pytest** (``pytest``, ``pytest_options``, ``pytest_v2``, ``matplotlib``,
  ``seaborn`` and their aliases): the final summary line
  (``== 1 failed, 3 passed in 0.1s ==``) must be present and nothing after it
  may read as a test status; the ``short test summary info`` block's lines must
  match the summary's counts, category by category, and agree with the status
  the whole log gives each graded test; the exit code must agree (failures or
  errors with exit 0 is a rewritten exit); and pytest's junit-xml report,
  written at session end, must hold every graded test the log says passed, as
  passed.
- **unittest / Django**: the ``Ran N tests in Xs`` trailer with its ``OK`` /
  ``FAILED (...)`` verdict must be present and nothing after it may read as a
  test status; the failure and error counts must equal the ``FAIL:`` /
  ``ERROR:`` headers unittest prints; no graded test the log says passed may
  have such a header; ``FAILED`` with exit 0 is a rewritten exit.
- **sympy**: the ``tests finished: ...`` line must be present and nothing after
  it may read as a status; failures or exceptions with exit 0 is a rewritten exit.
- Other runners (go, cargo, jest): no completion check here (see docs/rewards.md).

A missing record is ``runner_incomplete``; a record that contradicts the lines
is ``forged_log``.
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from .grading import resolve_test_id
from .parsers import get_parser
from .parsers.python_runners import (
    parse_django,
    parse_matplotlib,
    parse_pytest,
    parse_pytest_options,
    parse_pytest_v2,
    parse_seaborn,
    parse_sympy,
    parse_unittest,
)
from .status import StatusMap, TestStatus
from .witness import FORGED_LOG, RUNNER_INCOMPLETE, WitnessViolation

MAX_REPORT_BYTES = 64 * 1024 * 1024

_PYTEST_PARSERS = (
    parse_pytest,
    parse_pytest_options,
    parse_pytest_v2,
    parse_matplotlib,
    parse_seaborn,
)
_UNITTEST_PARSERS = (parse_django, parse_unittest)

_PYTEST_SUMMARY = re.compile(
    r"^=+ (?P<body>.+?) in [\d.]+ ?s(?:ec|econds)?(?: \([^)]*\))? =+$", re.MULTILINE
)
"""pytest >= 5.4 ends with ``in 0.15s`` (``in 12.3s (0:00:12)``), older ones with ``in 0.15 seconds``."""
_PYTEST_SHORT_HEADER = re.compile(r"^=+ short test summary info =+$", re.MULTILINE)
_COUNT = re.compile(r"(\d+) (\w+)")
_COUNT_WORDS = {
    "passed": "PASSED", "failed": "FAILED", "error": "ERROR", "errors": "ERROR",
    "xfailed": "XFAIL", "xpassed": "XPASS", "skipped": "SKIPPED",
}  # fmt: skip
_SKIP_GROUP = re.compile(r"^SKIPPED \[(\d+)\]")
_UNITTEST_RAN = re.compile(r"^Ran (\d+) tests? in [\d.]+s$", re.MULTILINE)
_UNITTEST_VERDICT = re.compile(r"^(OK|FAILED)(?: \((?P<counts>[^)]*)\))?$")
_UNITTEST_HEADER = re.compile(r"^(FAIL|ERROR): (.+)$")
_SYMPY_FINISHED = re.compile(r"^=+ tests finished: (?P<body>.+?) =+$", re.MULTILINE)
_PASSING = (TestStatus.PASSED.value, TestStatus.XFAIL.value)


def runner_family(parser_name: str) -> str | None:
    """``pytest``, ``unittest``, ``sympy``, or None when we have no completion check."""
    parser = get_parser(parser_name)
    if parser in _PYTEST_PARSERS:
        return "pytest"
    if parser in _UNITTEST_PARSERS:
        return "unittest"
    if parser is parse_sympy:
        return "sympy"
    return None


@dataclass(frozen=True)
class RunEvidence:
    """What the completion check reads: the test section, its parse, the run's exit code."""

    section: str
    parser_name: str
    statuses: StatusMap
    graded_ids: Sequence[str]
    exit_code: int
    junit_xml: bytes | None = None
    """pytest only: the report's bytes, or None when the run was asked for one and wrote none."""
    junit_expected: bool = False


def _forged(reason: str) -> WitnessViolation:
    return WitnessViolation(FORGED_LOG, reason)


def _incomplete(reason: str) -> WitnessViolation:
    return WitnessViolation(RUNNER_INCOMPLETE, reason)


def _graded_passes(evidence: RunEvidence) -> list[tuple[str, str]]:
    """(expected id, logged id) for every graded test the log says passed."""
    out = []
    for test_id in evidence.graded_ids:
        key = resolve_test_id(test_id, evidence.statuses)
        if key is not None and evidence.statuses[key] in _PASSING:
            out.append((test_id, key))
    return out


def _nothing_after(evidence: RunEvidence, after: str, what: str) -> None:
    late = get_parser(evidence.parser_name)(after)
    if late:
        first = next(iter(late))
        raise _forged(f"{len(late)} test status line(s) after {what} (first: {first!r})")


def check_completion(evidence: RunEvidence) -> None:
    """Raise :class:`WitnessViolation` unless the runner's completion record holds."""
    family = runner_family(evidence.parser_name)
    if family == "pytest":
        _check_pytest(evidence)
    elif family == "unittest":
        _check_unittest(evidence)
    elif family == "sympy":
        _check_sympy(evidence)


def _pytest_counts(body: str) -> Counter[str]:
    counts: Counter[str] = Counter()
    for number, word in _COUNT.findall(body):
        if word in _COUNT_WORDS:
            counts[_COUNT_WORDS[word]] += int(number)
    return counts


def _check_pytest(evidence: RunEvidence) -> None:
    section = evidence.section
    summaries = list(_PYTEST_SUMMARY.finditer(section))
    if not summaries:
        raise _incomplete("pytest's final summary line is missing: the run did not finish")
    final = summaries[-1]
    _nothing_after(evidence, section[final.end() :], "pytest's final summary line")
    counts = _pytest_counts(final.group("body"))
    if evidence.exit_code == 0 and (counts["FAILED"] or counts["ERROR"]):
        raise _forged(f"pytest reported failures ({final.group('body')}) but the run exited 0")
    headers = list(_PYTEST_SHORT_HEADER.finditer(section, 0, final.start()))
    if headers:
        block = section[headers[-1].end() : final.start()]
        _check_short_summary(evidence, block, counts)
    if evidence.junit_expected:
        if evidence.junit_xml is None:
            raise _incomplete("pytest wrote no junit report: the run did not reach its session end")
        _check_junit(evidence, evidence.junit_xml)


def _check_short_summary(evidence: RunEvidence, block: str, counts: Counter[str]) -> None:
    seen: Counter[str] = Counter()
    for line in block.split("\n"):
        skipped = _SKIP_GROUP.match(line)
        if skipped:
            seen["SKIPPED"] += int(skipped.group(1))
            continue
        word = line.split(" ", 1)[0]
        if word in _COUNT_WORDS.values() and " " in line:
            seen[word] += 1
    for word, number in seen.items():
        if number != counts[word]:
            raise _forged(
                f"pytest's short summary lists {number} {word} line(s), its final line counts {counts[word]}"
            )
    in_block = get_parser(evidence.parser_name)(block)
    for test_id in evidence.graded_ids:
        key = resolve_test_id(test_id, evidence.statuses)
        if key is not None and key in in_block and in_block[key] != evidence.statuses[key]:
            raise _forged(
                f"{test_id}: {evidence.statuses[key]} in the log, {in_block[key]} in pytest's short summary"
            )


def _junit_address(test_id: str) -> tuple[str, str]:
    """pytest's ``mangle_test_address``: ``a/b.py::C::t[x]`` -> (``a.b.C``, ``t[x]``)."""
    path, bracket, params = test_id.partition("[")
    names = path.split("::")
    names[0] = re.sub(r"\.py$", "", names[0].replace("/", "."))
    names[-1] += bracket + params
    return ".".join(names[:-1]), names[-1]


def _junit_verdicts(xml: bytes) -> dict[tuple[str, str], bool]:
    """(classname, name) -> passed (no failure, no error except at teardown, xfail counts as passed)."""
    if len(xml) > MAX_REPORT_BYTES:
        raise _forged(f"pytest's junit report is over {MAX_REPORT_BYTES} bytes")
    try:
        root = ET.fromstring(xml)
    except ET.ParseError as exc:
        raise _forged(f"pytest's junit report is not valid XML ({exc})") from None
    verdicts: dict[tuple[str, str], bool] = {}
    for case in root.iter("testcase"):
        key = (case.get("classname", ""), case.get("name", ""))
        passed = True
        for child in case:
            if (
                child.tag == "failure"
                or (
                    child.tag == "error"
                    and not (child.get("message") or "").startswith("failed on teardown")
                )
                or (child.tag == "skipped" and child.get("type") != "pytest.xfail")
            ):
                passed = False
        verdicts[key] = verdicts.get(key, True) and passed
    return verdicts


def _check_junit(evidence: RunEvidence, xml: bytes) -> None:
    verdicts = _junit_verdicts(xml)
    for test_id, logged in _graded_passes(evidence):
        classname, name = _junit_address(logged)
        found = verdicts.get((classname, name))
        if found is None and logged.count("[") > logged.count("]"):  # a truncated parametrised id
            matches = [v for (c, n), v in verdicts.items() if c == classname and n.startswith(name)]
            found = all(matches) if matches else None
        if found is None:
            raise _forged(f"{test_id}: passed in the log, absent from pytest's junit report")
        if not found:
            raise _forged(f"{test_id}: passed in the log, failed in pytest's junit report")


def _check_unittest(evidence: RunEvidence) -> None:
    lines = evidence.section.split("\n")
    trailer: tuple[int, re.Match[str]] | None = None
    for i, line in enumerate(lines):
        if _UNITTEST_RAN.match(line.strip()):
            for j in range(i + 1, min(i + 4, len(lines))):
                verdict = _UNITTEST_VERDICT.match(lines[j].strip())
                if verdict:
                    trailer = (j, verdict)
                    break
    if trailer is None:
        raise _incomplete(
            "unittest's 'Ran N tests' trailer and verdict are missing: the run did not finish"
        )
    end, verdict = trailer
    _nothing_after(evidence, "\n".join(lines[end + 1 :]), "the runner's 'Ran N tests' trailer")
    counts = dict.fromkeys(("failures", "errors"), 0)
    for part in (verdict.group("counts") or "").split(","):
        name, _, number = part.strip().partition("=")
        if name in counts and number.isdigit():
            counts[name] = int(number)
    headers = {"FAIL": [], "ERROR": []}  # type: dict[str, list[str]]
    for i, line in enumerate(lines[:end]):
        found = _UNITTEST_HEADER.match(line)
        if found and i > 0 and lines[i - 1].startswith("=" * 70):
            headers[found.group(1)].append(found.group(2).strip())
    if len(headers["FAIL"]) != counts["failures"] or len(headers["ERROR"]) != counts["errors"]:
        raise _forged(
            f"the trailer counts failures={counts['failures']} errors={counts['errors']}, "
            f"the log has {len(headers['FAIL'])} FAIL and {len(headers['ERROR'])} ERROR headers"
        )
    failed_names = headers["FAIL"] + headers["ERROR"]
    for test_id, logged in _graded_passes(evidence):
        if any(h == logged or h.startswith(logged + " ") for h in failed_names):
            raise _forged(f"{test_id}: passed in the log, but unittest reported it failing")
    if verdict.group(1) == "FAILED" and evidence.exit_code == 0:
        raise _forged("unittest's verdict is FAILED but the run exited 0")


def _check_sympy(evidence: RunEvidence) -> None:
    finished = list(_SYMPY_FINISHED.finditer(evidence.section))
    if not finished:
        raise _incomplete("sympy's 'tests finished' line is missing: the run did not finish")
    last = finished[-1]
    _nothing_after(evidence, evidence.section[last.end() :], "sympy's 'tests finished' line")
    body = last.group("body")
    bad = any(int(n) for n, w in _COUNT.findall(body) if w in ("failed", "exceptions"))
    if bad and evidence.exit_code == 0:
        raise _forged(f"sympy reported failures ({body}) but the run exited 0")
