"""What a *generated* task may contain beyond what the task format allows.

The format (``orchard.recipes.claw.tasks``) accepts hand-written tasks; a model-written task
is held to more, because nobody reviewed it before it runs:

- ``environment.image`` must be unset: generated tasks run in the default image (a model
  must not pick what is started);
- every ``regex`` in the grader is short (:data:`MAX_REGEX`, below the format's own
  ``patterns.MAX_PATTERN_CHARS``): a pattern a reviewer of the task can read;
- the whole task, as JSON, is at most :data:`MAX_TASK_BYTES`.

A pattern's shape is not checked for catastrophic backtracking (nested quantifiers and the
like). It was, by a heuristic on the text, while the grader ran patterns on Python's ``re``;
the heuristic missed patterns (``((a)|(a))*b``: a group in a group; ``a*a*a*a*b``: polynomial,
no group at all) and refused harmless ones (``(ab|cd)+``). The grader now runs every pattern
on RE2 (``orchard.recipes.claw.patterns``), which does not backtrack: its time is linear in
the text whatever the pattern, and the format refuses what RE2 cannot run (backreferences,
lookarounds) and what compiles too large. Nothing is left for a shape check to guard.

:func:`check` raises :class:`~.backend.InvalidTask` naming the field, so the model is told
what to fix like any other format error.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from typing import Any

from .backend import InvalidTask

MAX_REGEX = 200
MAX_TASK_BYTES = 256 * 1024


def _regexes(value: Any, path: str) -> Iterator[tuple[str, Any]]:
    stack = [(value, path)]
    while stack:
        item, where = stack.pop()
        if isinstance(item, dict):
            for key, child in item.items():
                if key == "regex":
                    yield f"{where}.{key}", child
                stack.append((child, f"{where}.{key}"))
        elif isinstance(item, list):
            stack.extend((child, f"{where}.{n}") for n, child in enumerate(item))


def check(data: Mapping[str, Any]) -> None:
    """Refuse what a generated task may not hold (see the module doc)."""
    size = len(json.dumps(data, ensure_ascii=False).encode())
    if size > MAX_TASK_BYTES:
        raise InvalidTask(f"the task is {size} bytes of JSON, over {MAX_TASK_BYTES}")
    environment = data.get("environment")
    if isinstance(environment, dict) and environment.get("image") is not None:
        raise InvalidTask(
            "environment.image: generated tasks run in the default image; leave it out"
        )
    for where, pattern in _regexes(data.get("grader"), "grader"):
        if not isinstance(pattern, str):
            continue  # the format says what is wrong with it
        if len(pattern) > MAX_REGEX:
            raise InvalidTask(f"{where}: a regex of {len(pattern)} characters, over {MAX_REGEX}")
