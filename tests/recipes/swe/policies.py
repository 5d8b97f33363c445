"""Scripted model policies for the SWE recipe's tests: functions of the Chat request body
(what the scripted upstream is sent) returning the entry to answer with."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any

SENTINEL_CMD = "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"

FIX_CALC = "sed -i 's|sum(values) / (len(values) + 1)|sum(values) / len(values)|' calc/__init__.py"


def turn(body: dict[str, Any]) -> int:
    """How many assistant turns the history already has (this call is turn N)."""
    return sum(1 for m in body.get("messages", ()) if m.get("role") == "assistant")


def bash(command: str, call_id: str = "c") -> dict[str, Any]:
    return {"tool_calls": [{"id": call_id, "name": "bash",
                            "arguments": json.dumps({"command": command})}]}  # fmt: skip


def commands(cmds: Sequence[str | dict[str, Any]]) -> Callable[[dict[str, Any]], dict[str, Any]]:
    """Answer turn i with ``cmds[i]`` (a command, or a raw entry), then keep submitting."""

    def policy(body: dict[str, Any]) -> dict[str, Any]:
        i = turn(body)
        if i >= len(cmds):
            return bash(SENTINEL_CMD, f"c{i}")
        item = cmds[i]
        return bash(item, f"c{i}") if isinstance(item, str) else item

    return policy
