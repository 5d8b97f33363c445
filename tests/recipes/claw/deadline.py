"""Python code run in a child process that is killed at a deadline.

For the tests of what may freeze its process: a regex that backtracks for ever holds the GIL
in C and never checks for signals, so no in-process timeout (pytest-timeout's included) could
stop it. Run in a child, it fails its test at the deadline instead of freezing the run.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

DEADLINE = 30.0
"""Seconds the child gets: a backtracking engine on the tests' patterns and values needs
longer than the age of the universe, a linear one milliseconds (plus the interpreter's start,
seconds at most on a loaded machine)."""


def run_python(code: str, *args: str, deadline: float = DEADLINE) -> str:
    """``code``'s standard output (``sys.argv[1:]`` is ``args``); the test fails if the child
    is still running at ``deadline`` (it is killed) or exits non-zero."""
    try:
        done = subprocess.run(
            [sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=deadline
        )
    except subprocess.TimeoutExpired:
        pytest.fail(f"still running after {deadline:.0f} s (killed): a regex backtracking (ReDoS)")
    assert done.returncode == 0, done.stderr
    return done.stdout
