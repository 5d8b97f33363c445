"""The execve rule (orchard.common.exec_limits) against the kernel itself, on this host.

The computed limit must be the kernel's: a command just inside it runs (execve
accepts it), one just past it is refused by us with the limit named, and the
kernel refuses that one too (E2BIG) — so we are never stricter, nor laxer.
"""

from __future__ import annotations

import errno
import os
import resource
import subprocess

import pytest

from orchard.common.exec_limits import (
    ARG_MAX,
    ARG_SPACE_CEILING,
    MAX_ARG_STRLEN,
    POINTER_SIZE,
    arg_space,
    exec_size_error,
    file_name_bound,
)
from orchard.common.exit_codes import returncode, shell_status


def test_arg_space_follows_the_stack_limit() -> None:
    assert arg_space(8 << 20) == 2 << 20
    assert arg_space(None) == ARG_SPACE_CEILING == 6 << 20
    assert arg_space(64 << 20) == ARG_SPACE_CEILING
    assert arg_space(100 << 10) == ARG_MAX  # never below 128 KiB


def test_per_string_limit_is_named() -> None:
    assert exec_size_error(["true", "x" * (MAX_ARG_STRLEN - 1)], [], 8 << 20) is None
    problem = exec_size_error(["true", "x" * MAX_ARG_STRLEN], [], 8 << 20)
    assert problem is not None and "MAX_ARG_STRLEN" in problem and "argument 1" in problem
    problem = exec_size_error(["true"], ["BIG=" + "v" * MAX_ARG_STRLEN], 8 << 20)
    assert problem is not None and "environment entry 0 ('BIG'" in problem


def test_file_name_bound_uses_path() -> None:
    assert file_name_bound("/bin/true", None) == len("/bin/true") + 1
    assert file_name_bound("true", "/a:/very/long/dir") == len("/very/long/dir/true") + 1


def _fill(space: int, env: list[str], argv0: str) -> list[str]:
    """An argv of 64 KiB strings plus a tail that takes exactly ``space`` with ``env``."""
    used = sum(len(e) + 1 for e in env) + file_name_bound(argv0, None)
    used += (1 + len(env)) * POINTER_SIZE + len(argv0) + 1
    argv = [argv0]
    piece = 64 * 1024
    while space - used > piece + 1 + POINTER_SIZE + 64:
        argv.append("a" * piece)
        used += piece + 1 + POINTER_SIZE
    argv.append("b" * (space - used - 1 - POINTER_SIZE))
    return argv


def _kernel_accepts(argv: list[str], env: list[str]) -> bool:
    try:
        subprocess.run(argv, env=dict(e.split("=", 1) for e in env), check=True)
    except OSError as err:
        assert err.errno == errno.E2BIG, err
        return False
    return True


@pytest.mark.skipif(not os.path.exists("/bin/true"), reason="needs /bin/true")
def test_the_computed_limit_is_the_kernels() -> None:
    soft = resource.getrlimit(resource.RLIMIT_STACK)[0]
    stack = None if soft == resource.RLIM_INFINITY else soft
    space = arg_space(stack)
    env = ["PATH=/usr/bin:/bin"]
    exact = _fill(space, env, "/bin/true")
    assert exec_size_error(exact, env, stack) is None
    assert _kernel_accepts(exact, env)
    over = [*exact[:-1], exact[-1] + "b" * 64]
    problem = exec_size_error(over, env, stack)
    assert problem is not None and "ARG_MAX" in problem
    assert not _kernel_accepts(over, env)


def test_exit_code_conventions() -> None:
    assert returncode(3, 0) == 3 and returncode(-1, 9) == -9 and returncode(-15, 15) == -15
    assert shell_status(0, 15) == 143 and shell_status(2, 0) == 2
    assert shell_status(-9, 9, timed_out=True) == 124
