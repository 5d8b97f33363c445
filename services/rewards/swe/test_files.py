"""Which files are the instance's test infrastructure (restored before the run, never the candidate's).

A file is test infrastructure when it is:

- a test file by its path (``tests/``, ``testing/``, a top-level ``test/`` (not
  ``django/test/``: that is the framework's source), ``test_*.py``, ``*_test.py``,
  ``conftest.py``, ``*.test.js``, ``_test.go``, ...), a file the instance's test
  patch touches, or the file of a graded test id (``a/b.py::test_x``);
- a file that configures or drives the runner wholly: ``pytest.ini``,
  ``conftest.py``, ``sitecustomize.py``, ``usercustomize.py``, any ``*.pth``,
  ``noxfile.py``, ``runtests.py``, or a file the test command or a pre-command
  names (``bin/test``, ``./run_tests.sh``, ``Makefile`` for ``make test``);
- a shared configuration file (``pyproject.toml``, ``setup.cfg``, ``tox.ini``)
  whose *test* sections changed (``[tool.pytest.*]``, ``[tool:pytest]``,
  ``[pytest]``, ``[tool.tox]``, ``[tox]``/``[testenv*]``, ``[coverage:*]`` /
  ``[tool.coverage.*]``, pytest plugin entry points): a fix may edit its
  dependencies, not how the tests run.

The runner puts every such file the candidate touched back to the base commit
(a file the candidate added is removed), then applies the test patch, and
reports ``test_infrastructure_modified`` with the paths.
"""

from __future__ import annotations

import configparser
import re
import shlex
import tomllib
from collections.abc import Iterable
from typing import Any

TEST_PATH = re.compile(
    r"(^|/)(tests|testing)/|^test/|(^|/)test_[^/]*\.py$|_tests?\.py$|(^|/)conftest\.py$"
    r"|\.(test|spec)\.[jt]sx?$|_test\.go$"
)
RUNNER_FILES = frozenset(
    {
        "conftest.py",
        "pytest.ini",
        "sitecustomize.py",
        "usercustomize.py",
        "noxfile.py",
        "runtests.py",
    }
)
MIXED_CONFIG = frozenset({"pyproject.toml", "setup.cfg", "tox.ini"})
_INI_TEST_SECTION = re.compile(r"^(tool:pytest|pytest|tox|testenv.*|coverage:.*|flake8)$")
_TOML_TEST_KEYS = (("tool", "pytest"), ("tool", "tox"), ("tool", "coverage"))


def _basename(path: str) -> str:
    return path.rsplit("/", 1)[-1]


def test_id_files(test_ids: Iterable[str]) -> set[str]:
    """The files named by pytest-style ids (``path.py::name``)."""
    return {
        t.split("::", 1)[0] for t in test_ids if "::" in t and t.split("::", 1)[0].endswith(".py")
    }


def command_files(commands: Iterable[str]) -> set[str]:
    """Relative paths a test command or pre-command names (``bin/test``, ``./run.sh``, ``Makefile``)."""
    out: set[str] = set()
    for command in commands:
        try:
            words = shlex.split(command)
        except ValueError:
            words = command.split()
        for word in words:
            word = word.removeprefix("./")
            if word in ("make", "tox", "nox"):
                out |= {"Makefile", "tox.ini", "noxfile.py"}
            if ("/" in word and not word.startswith(("/", "-"))) or word.endswith((".py", ".sh")):
                out.add(word.split("::", 1)[0])
    return out


def infrastructure_reason(path: str, named: set[str]) -> str | None:
    """Why ``path`` is test infrastructure whatever its content, or None (mixed files: see below)."""
    if path in named:
        return "named by the instance (test patch, test ids or test command)"
    if TEST_PATH.search(path):
        return "a test file"
    if _basename(path) in RUNNER_FILES or path.endswith(".pth"):
        return "configures the test runner"
    return None


def _ini_test_sections(text: str) -> dict[str, dict[str, str]] | None:
    parser = configparser.RawConfigParser(strict=False)
    try:
        parser.read_string(text)
    except configparser.Error:
        return None
    return {s: dict(parser[s]) for s in parser.sections() if _INI_TEST_SECTION.match(s)}


def _toml_test_sections(text: str) -> dict[str, Any] | None:
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError:
        return None
    out: dict[str, Any] = {}
    for keys in _TOML_TEST_KEYS:
        node: Any = data
        for key in keys:
            node = node.get(key) if isinstance(node, dict) else None
        out[".".join(keys)] = node
    entry_points = data.get("project", {}).get("entry-points", {})
    out["pytest11"] = entry_points.get("pytest11") if isinstance(entry_points, dict) else None
    return out


def test_config_changed(path: str, before: str | None, after: str | None) -> bool:
    """Did the candidate change the test sections of a shared config file (or make it unreadable)?"""
    if before == after:
        return False
    if before is None or after is None:
        return True  # added or deleted: a new rootdir config changes how pytest runs
    read = _toml_test_sections if path.endswith(".toml") else _ini_test_sections
    old, new = read(before), read(after)
    return new is None or old != new


def is_mixed_config(path: str) -> bool:
    return _basename(path) in MIXED_CONFIG
