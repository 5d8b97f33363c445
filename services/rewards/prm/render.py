"""Compact trajectory rendering for judges and the reranker.

A trajectory is a list of messages ``{"role": ..., "content": ...}`` (OpenAI
chat shape; tool results as role ``tool``). Long contents are cut to head and
tail; an output that looks like a test run is reduced to its result lines
(pass/fail/error lines and the summary), which is what a judge needs.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

HEAD_CHARS = 1200
TAIL_CHARS = 800
_TEST_RUN = re.compile(
    r"(=+ .*(passed|failed|error).* =+$|^Ran \d+ tests? in |collected \d+ items?|^(FAILED|PASSED|ERROR) \S)",
    re.MULTILINE,
)
_RESULT_LINE = re.compile(
    r"^(PASSED|FAILED|ERROR|XFAIL|XPASS|SKIPPED)\b|\.\.\. (ok|FAIL|ERROR|skipped)|^(FAIL|ERROR|OK)\b"
    r"|^=+ .* =+$|^Ran \d+ tests?|^(FAILED|OK) \(|^E\s{3}|Error:|collected \d+ items?",
)

Message = Mapping[str, Any]


def head_tail(text: str, head: int = HEAD_CHARS, tail: int = TAIL_CHARS) -> str:
    if len(text) <= head + tail + 40:
        return text
    return f"{text[:head]}\n[... {len(text) - head - tail} chars cut ...]\n{text[-tail:]}"


def is_test_output(text: str) -> bool:
    return _TEST_RUN.search(text) is not None


def reduce_test_output(text: str) -> str:
    lines = [line for line in text.splitlines() if _RESULT_LINE.search(line)]
    return "\n".join(lines) if lines else head_tail(text)


def _content(message: Message) -> str:
    content = message.get("content", "")
    if isinstance(content, list):  # multi-part messages: keep the text parts
        content = "\n".join(str(p.get("text", "")) for p in content if isinstance(p, Mapping))
    text = str(content or "")
    for call in message.get("tool_calls") or []:
        function = call.get("function", {}) if isinstance(call, Mapping) else {}
        text += f"\n[call {function.get('name', '?')}] {function.get('arguments', '')}"
    return text


def render_trajectory(messages: Sequence[Message], max_chars: int = 24_000) -> str:
    """The whole trajectory as numbered steps, compacted; the middle steps go first if too long."""
    steps: list[str] = []
    for i, message in enumerate(messages):
        role = str(message.get("role", "?"))
        if role == "system":
            continue
        text = _content(message)
        if role == "tool" and is_test_output(text):
            text = "[test output, result lines only]\n" + head_tail(reduce_test_output(text))
        else:
            text = head_tail(text)
        steps.append(f"### step {i} ({role})\n{text}")
    rendered = "\n\n".join(steps)
    while len(rendered) > max_chars and len(steps) > 2:
        del steps[len(steps) // 2]
        rendered = "\n\n".join(
            [*steps[: len(steps) // 2], "[... steps cut ...]", *steps[len(steps) // 2 :]]
        )
    return rendered[: max_chars + 200]


def commands_in(messages: Sequence[Message]) -> list[str]:
    """Shell commands the agent ran (tool-call arguments and ``command`` fields), best effort."""
    found: list[str] = []
    for message in messages:
        if message.get("role") != "assistant":
            continue
        if isinstance(message.get("command"), str):
            found.append(message["command"])
        found.append(_content(message))
    return found
