"""The scenario's commands and how their answers are judged (no Locust, no gevent here).

A check returns ``None`` for a right answer, else why it is wrong. It takes
either the gRPC ``RunResponse`` (the interceptor sees that) or the SDK's
``ExecResult`` (the user sees that): both have ``status.exit_code``,
``status.timed_out``, ``stdout`` and ``stderr``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

Check = Callable[[Any], str | None]


def output_check(expected_prefix: str) -> Check:
    """Exit code 0, not timed out, and stdout starting with ``expected_prefix``."""

    def check(response: Any) -> str | None:
        status = response.status
        if status.exit_code != 0 or status.timed_out:
            err = bytes(response.stderr[:200]).decode(errors="replace")
            return f"exit code {status.exit_code} (timed out: {status.timed_out}): {err!r}"
        out = bytes(response.stdout).decode(errors="replace")
        if not out.startswith(expected_prefix):
            return f"stdout {out[:120]!r} does not start with {expected_prefix!r}"
        return None

    return check


def ls_check(response: Any) -> str | None:
    problem: str | None = output_check("")(response)
    if problem is not None:
        return problem
    names = set(bytes(response.stdout).decode(errors="replace").split())
    missing = {"bin", "etc", "usr", "tmp"} - names
    return f"ls / lacks {sorted(missing)}" if missing else None


def create_check(response: Any) -> str | None:
    if not response.id or not response.executor.address:
        return f"create answered without an id or executor address (state {response.state})"
    return None


OS_RELEASE_FIRST_LINE = 'PRETTY_NAME="Debian GNU/Linux'

# The original's four commands, as argv (no extra shell around them), with their checks.
COMMANDS: tuple[tuple[str, list[str], Check], ...] = (
    (
        "exec python3",
        ["python3", "-c", 'import sys; print(f"Python {sys.version}")'],
        output_check("Python 3."),
    ),
    ("exec ls", ["ls", "/"], ls_check),
    (
        "exec cat",
        ["sh", "-c", "cat /etc/os-release | head -1"],
        output_check(OS_RELEASE_FIRST_LINE),
    ),
    (
        "exec login-shell cat",
        ["bash", "-lc", "cat /etc/os-release | head -1"],
        output_check(OS_RELEASE_FIRST_LINE),
    ),
)
