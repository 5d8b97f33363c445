"""Log parsers for Python test runners: pytest (three flavours), Django, unittest, sympy,
matplotlib, seaborn.

Each turns a test log into ``{test_id: status}``. The semantics follow the
``swebench`` 5.x parsers of the same names line for line (grading must agree on
the same logs; ``tests/rewards/test_parity.py`` checks it), quirks included:
the plain pytest parser keeps only the first whitespace-separated word of an id
(so ``test_x[a b]`` becomes ``test_x[a``; grading then matches it by prefix),
while ``pytest_v2`` keeps the whole id, spaces and brackets included.
"""

from __future__ import annotations

import re

from ..status import STATUS_WORDS, StatusMap, TestStatus

_SKIP_SUMMARY_COUNT = re.compile(r"^\[\d+\]$")
_ANSI_COLOUR = re.compile(r"\[(\d+)m")
_CONTROL_CHARS = str.maketrans("", "", "".join(chr(c) for c in range(1, 32)))
_PYTEST_OPTION = re.compile(r"(.*?)\[(.*)\]")


def _starts_with_status(line: str) -> bool:
    return any(line.startswith(word) for word in STATUS_WORDS)


def _is_skip_summary(status: str, name: str) -> bool:
    """pytest's ``SKIPPED [3] path:line: reason`` summary line: ``[3]`` is a count, not a test."""
    return status == TestStatus.SKIPPED and _SKIP_SUMMARY_COUNT.match(name) is not None


def _pytest_result_words(line: str) -> list[str] | None:
    """``STATUS id ...`` split on whitespace, or None for lines that are not results."""
    if not _starts_with_status(line):
        return None
    if line.startswith(TestStatus.FAILED):
        line = line.replace(" - ", " ")
    words = line.split()
    if len(words) <= 1 or _is_skip_summary(words[0], words[1]):
        return None
    return words


def parse_pytest(log: str) -> StatusMap:
    """``pytest -rA`` short summary lines: ``PASSED tests/test_a.py::test_x``."""
    statuses: StatusMap = {}
    for line in log.split("\n"):
        words = _pytest_result_words(line)
        if words is not None:
            statuses[words[1]] = words[0]
    return statuses


def _normalise_option(test_id: str) -> str:
    """``test_x[/abs/path/to/file]`` -> ``test_x[/file]``: ids that embed a temp path stay stable."""
    found = _PYTEST_OPTION.search(test_id)
    if found is None:
        return test_id
    main, option = found.groups()
    if option.startswith("/") and not option.startswith("//") and "*" not in option:
        option = "/" + option.split("/")[-1]
    return f"{main}[{option}]"


def parse_pytest_options(log: str) -> StatusMap:
    """Like :func:`parse_pytest`, with absolute paths inside ``[...]`` cut to their last part."""
    statuses: StatusMap = {}
    for line in log.split("\n"):
        words = _pytest_result_words(line)
        if words is not None:
            statuses[_normalise_option(words[1])] = words[0]
    return statuses


def parse_pytest_v2(log: str) -> StatusMap:
    """pytest with colours stripped and whole ids kept (``test_x[a b]`` stays whole).

    Also reads old-style verbose lines that end with the status (``id PASSED``).
    """
    statuses: StatusMap = {}
    for raw in log.split("\n"):
        line = _ANSI_COLOUR.sub("", raw).translate(_CONTROL_CHARS)
        if _starts_with_status(line):
            if line.startswith(TestStatus.FAILED):
                line = line.split(" - ", 1)[0]  # the assertion message is not part of the id
            words = line.split()
            if len(words) >= 2 and not _is_skip_summary(words[0], words[1]):
                statuses[" ".join(words[1:])] = words[0]
        elif any(line.endswith(word) for word in STATUS_WORDS):
            words = line.split()
            if len(words) >= 2:
                statuses[" ".join(words[:-1])] = words[-1]
    return statuses


def parse_matplotlib(log: str) -> StatusMap:
    """pytest, with ``MouseButton.LEFT/RIGHT`` in ids written as ``1``/``3`` (matplotlib's ids)."""
    statuses: StatusMap = {}
    for line in log.split("\n"):
        line = line.replace("MouseButton.LEFT", "1").replace("MouseButton.RIGHT", "3")
        words = _pytest_result_words(line)
        if words is not None:
            statuses[words[1]] = words[0]
    return statuses


def parse_seaborn(log: str) -> StatusMap:
    """seaborn's runs: ``FAILED id``, ``PASSED id`` or verbose ``id PASSED ...``."""
    statuses: StatusMap = {}
    for line in log.split("\n"):
        words = line.split()
        if len(words) < 2:
            continue
        if line.startswith(TestStatus.FAILED):
            statuses[words[1]] = TestStatus.FAILED
        elif f" {TestStatus.PASSED} " in line:
            if words[1] == TestStatus.PASSED:
                statuses[words[0]] = TestStatus.PASSED
        elif line.startswith(TestStatus.PASSED):
            statuses[words[1]] = TestStatus.PASSED
    return statuses


_SYMPY_FAILURE_HEADER = re.compile(r"(_*) (.*)\.py:(.*) (_*)")


def parse_sympy(log: str) -> StatusMap:
    """sympy's ``bin/test -v``: ``test_name ok|F|E`` lines and ``___ path.py:test ___`` failure headers."""
    statuses: StatusMap = {}
    for found in _SYMPY_FAILURE_HEADER.findall(log):
        statuses[f"{found[1]}.py:{found[2]}"] = TestStatus.FAILED
    for raw in log.split("\n"):
        line = raw.strip()
        if not line.startswith("test_"):
            continue
        if line.endswith(" E"):
            statuses[line.split()[0]] = TestStatus.ERROR
        if line.endswith(" F"):
            statuses[line.split()[0]] = TestStatus.FAILED
        if line.endswith(" ok"):
            statuses[line.split()[0]] = TestStatus.PASSED
    return statuses


_DJANGO_PASS_SUFFIXES = (" ... ok", " ... OK", " ...  OK")
_DJANGO_INTERRUPTED_OK = (
    # A test whose "... ok" was split by a multi-line message printed in between.
    re.compile(
        r"^(.*?)\s\.\.\.\sTesting\ against\ Django\ installed\ in\ ((?s:.*?))\ silenced\)\.\nok$",
        re.MULTILINE,
    ),
    re.compile(r"^(.*?)\s\.\.\.\sInternal\ Server\ Error:\ \/(.*)\/\nok$", re.MULTILINE),
    re.compile(
        r"^(.*?)\s\.\.\.\sSystem check identified no issues \(0 silenced\)\nok$", re.MULTILINE
    ),
)


def parse_django(log: str) -> StatusMap:
    """Django's runner (``runtests.py -v 2``), i.e. unittest's verbose ``name ... ok`` lines."""
    statuses: StatusMap = {}
    previous_test: str | None = None
    for raw in log.split("\n"):
        line = raw.strip()
        if "--version is equivalent to version" in line:
            statuses["--version is equivalent to version"] = TestStatus.PASSED
        if " ... " in line:
            previous_test = line.split(" ... ")[0]
        for suffix in _DJANGO_PASS_SUFFIXES:
            if line.endswith(suffix):
                if line.strip().startswith(
                    "Applying sites.0002_alter_domain_unique...test_no_migrations"
                ):
                    line = line.split("...", 1)[-1].strip()  # django__django-7188's interleaving
                statuses[line.rsplit(suffix, 1)[0]] = TestStatus.PASSED
                break
        if " ... skipped" in line:
            statuses[line.split(" ... skipped")[0]] = TestStatus.SKIPPED
        if line.endswith(" ... FAIL"):
            statuses[line.split(" ... FAIL")[0]] = TestStatus.FAILED
        if line.startswith("FAIL:"):
            statuses[line.split()[1].strip()] = TestStatus.FAILED
        if line.endswith(" ... ERROR"):
            statuses[line.split(" ... ERROR")[0]] = TestStatus.ERROR
        if line.startswith("ERROR:"):
            statuses[line.split()[1].strip()] = TestStatus.ERROR
        if line.lstrip().startswith("ok") and previous_test is not None:
            statuses[previous_test] = TestStatus.PASSED  # "... <output lines> ok"
    for pattern in _DJANGO_INTERRUPTED_OK:
        for found in pattern.finditer(log):
            statuses[found.group(1)] = TestStatus.PASSED
    return statuses


def parse_unittest(log: str) -> StatusMap:
    """Plain ``python -m unittest -v``: ``test_x (pkg.mod.Class.test_x) ... ok|FAIL|ERROR|skipped ...``.

    ``swebench`` has no parser of this name; unittest's verbose lines are the
    ones Django's runner prints, so this reads them the same way and adds the
    two words Django's parser ignores: ``expected failure`` (XFAIL, a pass when
    graded) and ``unexpected success`` (FAILED: unittest counts it as a failure).
    """
    statuses = parse_django(log)
    for raw in log.split("\n"):
        line = raw.strip()
        if line.endswith(" ... expected failure"):
            statuses[line.rsplit(" ... expected failure", 1)[0]] = TestStatus.XFAIL
        elif line.endswith(" ... unexpected success"):
            statuses[line.rsplit(" ... unexpected success", 1)[0]] = TestStatus.FAILED
    return statuses
