"""The grader's regular expressions: RE2, which matches in time linear in the text.

A task's ``regex`` operators are matched on the driver against what the agent wrote into the
mock services (mail bodies, file texts, tool arguments, its final answer): hostile text. A
backtracking engine (Python's ``re``) takes exponential or high-polynomial time on patterns
such as ``(a+)+$``, ``((a)|(a))*b`` or ``a*a*a*a*b`` over a few thousand characters the
agent chose, holding the GIL in C where no timeout reaches it: one such pattern in a task
(hand-written or generated) froze the driver. No heuristic on the pattern's text finds every
such pattern, so none is tried here: every pattern runs on RE2 (PyPI ``google-re2``), which
has no backtracking, and so no backreferences or lookarounds (such a pattern is refused when
the task is loaded, with RE2's reason).

Linear is not free: a search costs up to (characters) x (the compiled program's size) when
RE2's DFA gives up and its NFA runs. Both factors are bounded: a pattern is at most
:data:`MAX_PATTERN_CHARS` characters and compiles to at most :data:`MAX_PROGRAM_SIZE`
instructions (RE2 itself refuses a repetition count over 1000), and a string over
:data:`MAX_MATCHED_CHARS` characters is not searched (it does not match). Matches are only
ever a yes or no, so nothing is captured (RE2 then never needs its slower submatch engines).

Case-insensitive always (as the grader's ``contains``). RE2's syntax is Python's for
everything a grader needs; the differences that matter: ``\\d``, ``\\w``, ``\\s`` and ``\\b``
are ASCII (``\\pL``, ``\\pN`` for Unicode), ``$`` is the end of the text only (not before a
final newline), ``\\Z`` is written ``\\z``; see https://github.com/google/re2/wiki/Syntax.
"""

from __future__ import annotations

import functools
from typing import Any

import re2

MAX_PATTERN_CHARS = 1000
"""The longest pattern a task may hold (the generator holds its own tasks to less)."""

MAX_PROGRAM_SIZE = 2000
"""The most RE2 instructions a pattern may compile to: a search's worst case is this many
steps per character. A plain pattern is tens (``fine|look(s)? (good|ok)``: 29); bounded
repetitions and Unicode classes cost the most (``.{100}``: 804, ``[^@]{1,64}@[a-z.]+``: 588,
``[^@]{1,255}``: 2298, refused)."""

MAX_MATCHED_CHARS = 200_000
"""The longest string a ``regex`` is matched against: as long as the longest text a fixture
may hold (``services.fixtures.MAX_TEXT``), above what the services let an agent write (a mail
body: 100 000; a file's text in the state: 64 KiB). Only a longer final answer goes over; it
does not match (``not`` of it holds)."""


class PatternError(ValueError):
    """A pattern the grader will not run: the sentence says why (RE2's reason, or a bound)."""


def _options() -> Any:
    options = re2.Options()
    options.case_sensitive = False
    options.never_capture = True  # a yes or no: no groups to fill, so no submatch engine
    options.log_errors = False  # the reason is raised, not printed on the driver's stderr
    return options


@functools.lru_cache(maxsize=1024)
def compile_pattern(pattern: str) -> Any:
    """``pattern`` compiled for :func:`search` (cached: a grader matches the same few patterns
    against many records); :class:`PatternError` if RE2 cannot run it or it is over a bound."""
    if len(pattern) > MAX_PATTERN_CHARS:
        raise PatternError(f"a pattern of {len(pattern)} characters, over {MAX_PATTERN_CHARS}")
    try:
        compiled = re2.compile(pattern, _options())
    except re2.error as err:
        reason = err.args[0] if err.args else "?"
        if isinstance(reason, bytes):
            reason = reason.decode("utf-8", "replace")
        raise PatternError(
            f"not a regular expression RE2 runs ({reason}; RE2 matches in linear time, "
            "so it has no backreferences or lookarounds)"
        ) from None
    # the wrapper keeps RE2's own object as _regexp (pinned version: pyproject.toml)
    size = int(compiled._regexp.ProgramSize())
    if size > MAX_PROGRAM_SIZE:
        raise PatternError(
            f"the pattern compiles to {size} RE2 instructions, over {MAX_PROGRAM_SIZE} "
            "(a long bounded repetition such as .{500} or [^@]{1,255}): use a shorter one"
        )
    return compiled


def search(pattern: str, text: str) -> bool:
    """Whether ``pattern`` matches somewhere in ``text``, case-insensitively (False for a text
    over :data:`MAX_MATCHED_CHARS`)."""
    if len(text) > MAX_MATCHED_CHARS:
        return False
    return compile_pattern(pattern).search(text) is not None
