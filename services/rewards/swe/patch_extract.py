"""Taking the patch out of an agent's final output.

Accepts a raw unified diff, or one inside a fenced block (```diff, ```patch,
or a bare fence) anywhere in the text; the last fenced diff wins (agents
often show drafts first). Output with no diff markers (``diff --git`` or a
``--- `` / ``+++ `` pair with a ``@@`` hunk) has no patch: ``None``.
"""

from __future__ import annotations

import re

_FENCE = re.compile(r"```[ \t]*([\w+-]*)[ \t]*\n(.*?)```", re.DOTALL)
_GIT_HEADER = re.compile(r"^diff --git ", re.MULTILINE)
_UNIFIED_HEADER = re.compile(r"^--- \S.*\n\+\+\+ \S.*\n@@ ", re.MULTILINE)


def looks_like_diff(text: str) -> bool:
    return bool(_GIT_HEADER.search(text) or _UNIFIED_HEADER.search(text))


def _from_first_header(text: str) -> str:
    starts = [m.start() for m in (_GIT_HEADER.search(text), _UNIFIED_HEADER.search(text)) if m]
    return text[min(starts) :]


def _ensure_newline(patch: str) -> str:
    return patch if patch.endswith("\n") else patch + "\n"


def extract_patch(output: str) -> str | None:
    """The unified diff in ``output``, ready for ``git apply``; None when there is none."""
    if not output or not output.strip():
        return None
    fenced = [body for _lang, body in _FENCE.findall(output) if looks_like_diff(body)]
    if fenced:
        return _ensure_newline(_from_first_header(fenced[-1]))
    if looks_like_diff(output):
        return _ensure_newline(_from_first_header(output))
    return None
