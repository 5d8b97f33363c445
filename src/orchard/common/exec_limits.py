"""What ``execve(2)`` accepts, computed the way Linux does (fs/exec.c), before we ask it.

A command's argv and environment are copied onto the new program's stack,
and the kernel refuses (E2BIG) when:

* one string (an argument, or one ``NAME=value``) is longer than
  ``MAX_ARG_STRLEN`` (32 pages: 128 KiB with 4 KiB pages), its NUL included;
* all strings with their NULs, the program's file name, and one pointer per
  argument and per variable take more than a quarter of the stack limit
  (``RLIMIT_STACK`` soft), never less than ``ARG_MAX`` (128 KiB) and never
  more than three quarters of ``_STK_LIM`` (6 MiB).

So that limit is the sandbox's, and Orchard checks exactly it (no stricter
round number) and refuses beyond it with INVALID_ARGUMENT naming the limit,
instead of starting the command and reporting a confusing "Argument list too
long" exit 126. Used by the executor (with the sandbox's own stack limit) and
by the ``orchard.testing`` fake (with its host's).
"""

from __future__ import annotations

import os
import struct
from collections.abc import Sequence

PAGE_SIZE = os.sysconf("SC_PAGESIZE")
MAX_ARG_STRLEN = 32 * PAGE_SIZE
ARG_MAX = 32 * 4096  # include/uapi/linux/limits.h: the floor of the argument space
STK_LIM = 8 << 20  # _STK_LIM
ARG_SPACE_CEILING = STK_LIM // 4 * 3
POINTER_SIZE = struct.calcsize("P")
PATH_MAX = 4096
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def arg_space(stack_soft_limit: int | None) -> int:
    """Bytes execve allows for strings + pointers under a stack soft limit (None: unlimited)."""
    limit = ARG_SPACE_CEILING
    if stack_soft_limit is not None:
        limit = min(limit, stack_soft_limit // 4)
    return max(limit, ARG_MAX)


def _size(text: str) -> int:
    return len(text.encode("utf-8", "surrogateescape")) + 1


def file_name_bound(argv0: str, path_var: str | None) -> int:
    """The longest file name execvp may try for ``argv0`` (each PATH entry + name), NUL included."""
    if "/" in argv0:
        return _size(argv0)
    dirs = (path_var if path_var is not None else DEFAULT_PATH).split(":")
    return max(_size(f"{d or '.'}/{argv0}") for d in dirs)


def exec_size_error(
    argv: Sequence[str], env: Sequence[str], stack_soft_limit: int | None
) -> str | None:
    """Why execve would refuse ``argv`` + ``env`` (``NAME=value`` strings), or None."""
    space = arg_space(stack_soft_limit)
    # Fast path (every ordinary command): a UTF-8 character is at most 4 bytes, so
    # when 4x the characters fit, nothing needs encoding (this runs on every exec).
    longest = max(map(len, argv), default=0), max(map(len, env), default=0)
    chars = sum(map(len, argv)) + sum(map(len, env)) + len(argv) + len(env)
    count = max(len(argv), 1) + len(env)
    if (
        4 * max(longest) < MAX_ARG_STRLEN
        and 4 * chars + 2 * PATH_MAX + count * POINTER_SIZE < space
    ):
        return None
    for what, group in (("argument", argv), ("environment entry", env)):
        for i, text in enumerate(group):
            size = _size(text)
            if size > MAX_ARG_STRLEN:
                shown = text[:40] if what == "argument" else text.partition("=")[0][:40]
                return (
                    f"{what} {i} ({shown!r}...) is {size} bytes with its NUL; execve takes at "
                    f"most {MAX_ARG_STRLEN} per string (the kernel's MAX_ARG_STRLEN)"
                )
    path_var = next((e[5:] for e in reversed(env) if e.startswith("PATH=")), None)
    strings = sum(map(_size, argv)) + sum(map(_size, env))
    strings += file_name_bound(argv[0], path_var) if argv else 0
    pointers = count * POINTER_SIZE
    if strings + pointers > space:
        stack = "unlimited" if stack_soft_limit is None else f"{stack_soft_limit} bytes"
        return (
            f"argv and environment take {strings + pointers} bytes ({strings} of strings with "
            f"their NULs and the program's path, {pointers} of pointers); execve in this "
            f"sandbox accepts at most {space} (the kernel's ARG_MAX rule: a quarter of the "
            f"stack limit, {stack}, at least {ARG_MAX}, at most {ARG_SPACE_CEILING})"
        )
    return None
