"""How a command's end is told as one integer: subprocess's convention, everywhere.

A command that exits reports its exit status (0..255); one killed by signal N
reports ``-N``, exactly like ``subprocess.Popen.returncode`` (what Python
users already test: ``if result.exit_code < 0``), and the signal number is
also given on its own (``signal``). The shell's convention (``128 + N``) is
kept for what behaves like a shell: the ``orchard`` CLI's own exit status
(:func:`shell_status`), so ``orchard exec ID -- sleep 100`` killed by SIGKILL
exits 137 as ``sh -c`` would. ``-N`` is chosen for the API because ``128 + N``
is ambiguous there (a program may ``exit(137)`` itself); ``-N`` never is.

Used by the executor (the source of ExecStatus), the ``orchard.testing`` fake,
the SDK (which also normalises the ``-1`` older executors sent), the CLI and
any handle on a command (background processes): one function, one answer.
"""

from __future__ import annotations

SHELL_SIGNAL_BASE = 128
SHELL_TIMEOUT_STATUS = 124  # GNU timeout(1)'s status for "timed out"


def returncode(exit_code: int, signal: int) -> int:
    """``-signal`` if a signal ended the command, else its exit code (subprocess's rule)."""
    if signal > 0:
        return -signal
    return exit_code


def shell_status(exit_code: int, signal: int, timed_out: bool = False) -> int:
    """The status a shell would give: 124 on a timeout, ``128 + N`` for signal N, else the
    exit code (what the CLI process exits with)."""
    if timed_out:
        return SHELL_TIMEOUT_STATUS
    code = returncode(exit_code, signal)
    if code < 0:
        return SHELL_SIGNAL_BASE - code
    return code
