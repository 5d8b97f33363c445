"""The argument space of a sandbox: ``execve``'s limit under its stack rlimit.

Commands are forked by the sandbox's init and inherit its ``RLIMIT_STACK``,
so the kernel's limit for their argv + environment is computed from that
(:mod:`orchard.common.exec_limits`): read from ``/proc/<init pid>/limits`` on
a node executor, from this process on an executor inside the sandbox (the
same container, the same limits). It is read once per init pid and cached:
an init does not change its own stack limit, and if something in the
sandbox lowers it later, the kernel's E2BIG still answers (as exit 126).
"""

from __future__ import annotations

import resource

from orchard.common.errors import invalid
from orchard.common.exec_limits import exec_size_error

_cache: dict[int, int | None] = {}
_MAX_CACHED = 4096


def _parse_stack(text: str) -> int | None:
    for line in text.splitlines():
        if line.startswith("Max stack size"):
            soft = line[len("Max stack size") :].split()[0]
            return None if soft == "unlimited" else int(soft)
    raise ValueError("no 'Max stack size' line")


def stack_limit(init_pid: int) -> int | None:
    """The soft RLIMIT_STACK commands of the sandbox get (None: unlimited)."""
    if init_pid <= 0:
        soft, _hard = resource.getrlimit(resource.RLIMIT_STACK)
        return None if soft == resource.RLIM_INFINITY else soft
    if init_pid in _cache:
        return _cache[init_pid]
    try:
        with open(f"/proc/{init_pid}/limits") as f:
            value = _parse_stack(f.read())
    except (OSError, ValueError):
        return stack_limit(0)  # init gone (the exec fails on its own) or odd: our own limit
    if len(_cache) >= _MAX_CACHED:
        _cache.clear()
    _cache[init_pid] = value
    return value


def check_exec_size(argv: tuple[str, ...], env: tuple[str, ...], init_pid: int) -> None:
    """INVALID_ARGUMENT naming the kernel's limit when execve would refuse the command."""
    problem = exec_size_error(argv, env, stack_limit(init_pid))
    if problem is not None:
        raise invalid(problem)
