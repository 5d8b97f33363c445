"""Reading a generation model's reply: one JSON object, from hostile text, within bounds.

Every stage asks the model for one JSON object (the ideas, the task). A reply is the model's
text and is treated as hostile: it may be huge, not JSON, JSON nested to exhaust the parser,
several objects, or prose around a fenced block. :func:`json_object` accepts exactly two
shapes, the whole reply as one object or the reply's only ```json fenced block as one object,
and raises :class:`MalformedReply` saying what was wrong otherwise (the build stage feeds
that sentence back to the model). Nothing in a reply is ever executed; sizes and depth are
capped before and after parsing.

Why not a lenient JSON repair library: a reply we have to guess at is a reply whose task we
cannot trust; the model is told the error and writes it again (bounded attempts).
"""

from __future__ import annotations

import json
import re
from typing import Any

MAX_REPLY_CHARS = 256 * 1024
"""A reply longer than this is refused before parsing."""
MAX_DEPTH = 32
"""Deepest nesting of arrays and objects accepted."""

_FENCE = re.compile(r"```(?:json|JSON)?[ \t]*\n(.*?)\n?```", re.DOTALL)


class MalformedReply(ValueError):
    """The reply is not one bounded JSON object; the message says why (shown to the model)."""


def _depth(value: Any, limit: int) -> int:
    """Nesting depth of ``value``, iteratively (a deep value must not exhaust the stack)."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, level = stack.pop()
        if not isinstance(item, dict | list):
            continue
        deepest = max(deepest, level)
        if deepest > limit:
            return deepest
        children = item.values() if isinstance(item, dict) else item
        stack.extend((child, level + 1) for child in children)
    return deepest


def json_object(text: Any, *, max_chars: int = MAX_REPLY_CHARS) -> dict[str, Any]:
    """The one JSON object ``text`` is, or holds in its only ```json fence."""
    if not isinstance(text, str) or not text.strip():
        raise MalformedReply("the reply is empty: answer with one JSON object")
    if len(text) > max_chars:
        raise MalformedReply(f"the reply has {len(text)} characters, over the {max_chars} allowed")
    body = text.strip()
    if not body.startswith("{"):
        fences = _FENCE.findall(body)
        if len(fences) != 1:
            raise MalformedReply(
                "the reply is neither one JSON object nor exactly one ```json fenced block "
                f"({len(fences)} fenced blocks found)"
            )
        body = fences[0].strip()
    try:
        value = json.loads(body)
    except RecursionError:
        raise MalformedReply(f"the JSON is nested deeper than {MAX_DEPTH} levels") from None
    except ValueError as err:
        raise MalformedReply(f"the JSON does not parse: {err}") from None
    if not isinstance(value, dict):
        raise MalformedReply(f"the JSON is a {type(value).__name__}, not an object")
    if _depth(value, MAX_DEPTH) > MAX_DEPTH:
        raise MalformedReply(f"the JSON is nested deeper than {MAX_DEPTH} levels")
    return value
