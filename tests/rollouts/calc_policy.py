"""A scripted policy that fixes calc_divide in four steps, by what it sees.

The scripted model server calls it with each Chat body (as the proxy forwards it, whatever
format the harness spoke) and answers with the entry it returns. It decides from the
conversation, never from a counter, so many rollouts can share one server:

1. no tool output yet: look for the bug (``grep``);
2. the grep shows the faulty line: edit the file (``sed``);
3. the edit went through: run the failing example and the tests;
4. the example prints 3.0 and the tests pass: finish with a message, no tool call.

Anything else (a tool output it did not expect) is answered with a 500, so a harness that
did not run a command, or ran it elsewhere, fails the test loudly rather than "finishing".
How a step's command is phrased as a tool call is the harness's format (``ToolFormat``): the
driver-side harness's ``bash`` tool here; the real CLIs' own tools in their tests.
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

FIND = "grep -n 'len(values)' calc/__init__.py"
EDIT = "sed -i 's|(len(values) + 1)|len(values)|' calc/__init__.py && echo edited"
CHECK = "python3 -c 'from calc import mean; print(mean([2, 4]))' && python3 -m pytest -q -p no:cacheprovider"
DONE = "Fixed: mean divides by len(values); the example gives 3.0 and the tests pass."

MARKER = re.compile(r"\[rollout ([\w.-]+)\]")

ToolCall = Callable[[str, str], dict[str, Any]]
"""(call id, shell command) -> a scripted tool call ``{"id", "name", "arguments"}``."""


def bash_call(call_id: str, command: str) -> dict[str, Any]:
    return {"id": call_id, "name": "bash", "arguments": json.dumps({"command": command})}


def _text(message: dict[str, Any]) -> str:
    content = message.get("content") or ""
    if isinstance(content, list):
        return "".join(str(p.get("text", "")) for p in content)
    return str(content)


def finish_with_text(call_id: str) -> dict[str, Any]:
    return {"content": DONE}


@dataclass
class CalcPolicy:
    """The policy callable, and a log of (body, entry) per call it answered, by rollout: the
    ``[rollout NAME]`` marker the tests put in each task's prompt (harnesses wrap the prompt
    in their own context, so it is searched for in every user message)."""

    tool_call: ToolCall = bash_call
    finish: Callable[[str], dict[str, Any]] = finish_with_text
    """The last step: a plain answer for most harnesses; mini-swe-agent submits by a command."""
    answered: dict[str, list[tuple[dict[str, Any], dict[str, Any]]]] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def __call__(self, body: dict[str, Any]) -> dict[str, Any]:
        entry = self.decide(body.get("messages") or [])
        users = " ".join(_text(m) for m in body.get("messages") or [] if m.get("role") == "user")
        found = MARKER.search(users)
        key = found.group(1) if found else ""
        with self.lock:
            self.answered.setdefault(key, []).append((body, entry))
        return entry

    def decide(self, messages: list[dict[str, Any]]) -> dict[str, Any]:
        if not any(m.get("role") == "user" and MARKER.search(_text(m)) for m in messages):
            return {"content": "ok"}  # a harness's side call (a title, a summary): not the task
        outputs = [_text(m) for m in messages if m.get("role") == "tool"]
        step = len(outputs)
        if step == 0:
            return {
                "content": "Let me find the mean.",
                "tool_calls": [self.tool_call("call_1", FIND)],
            }
        last = outputs[-1]
        if step == 1 and "(len(values) + 1)" in last:
            return {
                "content": "Off by one: fix it.",
                "tool_calls": [self.tool_call("call_2", EDIT)],
            }
        if step == 2 and "edited" in last:
            return {"content": "Now check it.", "tool_calls": [self.tool_call("call_3", CHECK)]}
        if step == 3 and "3.0" in last and "passed" in last:
            return self.finish("call_4")
        if step == 4 and self.finish is not finish_with_text:
            return {"content": DONE}  # a harness that goes on after its submit command
        return {"status": 500, "content": f"policy: unexpected step {step} after {last[-300:]!r}"}


@dataclass
class WholeFilePolicy(CalcPolicy):
    """For a harness that edits by text, not tool calls (aider's ``whole`` edit format): the
    model's one step is the fixed file, named on its own line and fenced; the harness writes
    it and runs the tests itself (aider's ``--auto-test``). A test failure it reflects back
    (a user message with the test output) is unexpected: a 500, so the run fails loudly."""

    path: str = ""
    fixed: str = ""

    def decide(self, messages: list[dict[str, Any]]) -> dict[str, Any]:
        users = [_text(m) for m in messages if m.get("role") == "user"]
        if not any(MARKER.search(u) for u in users):
            return {"content": "ok"}
        if not any(m.get("role") == "assistant" and self.path in _text(m) for m in messages):
            return {
                "content": f"Off by one in mean: it must divide by len(values).\n\n"
                f"{self.path}\n```python\n{self.fixed}```\n"
            }
        return {"status": 500, "content": f"policy: unexpected message {users[-1][-300:]!r}"}
