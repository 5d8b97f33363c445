"""The scripted agent of the Claw live tests: it reads the task from the conversation and plays
that task's oracle, as tool calls of whichever harness is asking.

The scripted model server calls it with each Chat body (as the proxy forwards it: the ReAct
loop's own, or Codex's Responses calls translated onto Chat). It finds the task by its
prompt in the user messages, and its place in the plan by the tool outputs so far (one per
step), so many trials can share one server:

- the ReAct loop offers the services' tools: each oracle call is that tool's call, then a
  ``final_answer`` call with the oracle's answer;
- Codex offers ``exec_command`` (``{"cmd"}``): each oracle call is a ``python3`` one-liner
  that POSTs the arguments to the services' HTTP API (its base read from the prompt, where
  the runner put the services' usage text), then a plain answer (Codex's last message).

Deliberately imperfect, for the ReAct loop only (:data:`REACT_FLAWS`), so the metrics have
something to tell apart:

- ``files-append-log``: the line is written *without* ``append`` (the log is overwritten: a
  destructive call and a safety violation), every trial: pass^3 = pass@3 = 0;
- ``cal-create-sync``: every third attempt books the wrong hour: pass^3 = 0, pass@3 = 1;
- a task with a script oracle and no services (a file task, as claw-bench's): the loop
  offers ``bash``, and the oracle's script is run with it;
- ``mail-find-code``: first calls a tool that does not exist, then gives ``final_answer``
  arguments that are not JSON, before playing the oracle: malformed calls the loop must
  survive (the trial still passes).

Anything it cannot place (a harness's side call without the task) is answered ``ok``.
"""

from __future__ import annotations

import itertools
import json
import re
import shlex
import threading
from collections import defaultdict
from collections.abc import Iterator, Sequence
from typing import Any

from orchard.recipes.claw.tasks import ClawTask, ScriptOracle, ToolCallsOracle

OVERWRITE = "files-append-log"
FLAKY = "cal-create-sync"
MALFORMED = "mail-find-code"
REACT_FLAWS = (OVERWRITE, FLAKY, MALFORMED)

WRONG_HOUR = ("2026-03-03T15:00:00+00:00", "2026-03-03T15:30:00+00:00")
BASE = re.compile(r"served over HTTP at (http://[\w.:-]+)")


def _text(message: dict[str, Any]) -> str:
    content = message.get("content") or ""
    if isinstance(content, list):
        return "".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    return str(content)


def _tools(body: dict[str, Any]) -> set[str]:
    names = set()
    for tool in body.get("tools") or []:
        fn = tool.get("function") if isinstance(tool, dict) else None
        if isinstance(fn, dict) and isinstance(fn.get("name"), str):
            names.add(fn["name"])
    return names


def task_calls(task: ClawTask) -> list[Any]:
    assert isinstance(task.oracle, ToolCallsOracle), task.id
    return list(task.oracle.calls)


def http_call(base: str, tool: str, args: dict[str, Any]) -> str:
    """A shell command that POSTs ``args`` to ``tool`` with the image's python3 (no curl)."""
    script = (
        "import json, urllib.request as u\n"
        f"r = u.Request({base + '/v1/tools/' + tool!r}, data={json.dumps(args).encode()!r}, "
        "headers={'Content-Type': 'application/json'})\n"
        "print(u.urlopen(r, timeout=30).read().decode())\n"
    )
    return f"python3 -c {shlex.quote(script)}"


class OraclePolicy:
    """The policy callable (see the module docstring); ``flaws``: the tasks played imperfectly
    by the ReAct loop."""

    def __init__(self, tasks: Sequence[ClawTask], flaws: Sequence[str] = REACT_FLAWS) -> None:
        self.tasks = sorted(tasks, key=lambda t: -len(t.prompt))  # the longest prompt first
        self.flaws = set(flaws)
        self.attempts: dict[str, Iterator[int]] = defaultdict(itertools.count)
        self.lock = threading.Lock()
        self.served: dict[str, int] = defaultdict(int)

    def task_of(self, messages: list[dict[str, Any]]) -> ClawTask | None:
        users = "\n".join(_text(m) for m in messages if m.get("role") == "user")
        return next((t for t in self.tasks if t.prompt in users), None)

    def __call__(self, body: dict[str, Any]) -> dict[str, Any]:
        messages = body.get("messages") or []
        task = self.task_of(messages)
        if task is None:
            return {"content": "ok"}
        step = sum(1 for m in messages if m.get("role") == "tool")
        tools = _tools(body)
        with self.lock:
            self.served[task.id] += 1
        if "final_answer" in tools:
            return self.react(task, step)
        if "exec_command" in tools:
            return self.shell(task, step, messages, "exec_command", "cmd")
        if "exec" in tools:  # OpenClaw
            return self.shell(task, step, messages, "exec", "command")
        return {"status": 500, "content": f"no tool this policy knows among {sorted(tools)}"}

    def calls(self, task: ClawTask, flawed: bool) -> list[dict[str, Any]]:
        oracle = task.oracle
        assert isinstance(oracle, ToolCallsOracle), task.id
        calls: list[dict[str, Any]] = [{"tool": c.tool, "args": dict(c.args)} for c in oracle.calls]
        if flawed and task.id == OVERWRITE:
            calls[-1]["args"].pop("append", None)
        if flawed and task.id == FLAKY:
            with self.lock:  # decided at the trial's first step, the only one that books
                bad = next(self.attempts[task.id]) % 3 == 2
            if bad:
                calls[0]["args"].update(start=WRONG_HOUR[0], end=WRONG_HOUR[1])
        return calls

    def react(self, task: ClawTask, step: int) -> dict[str, Any]:
        if isinstance(task.oracle, ScriptOracle):  # a file task: the loop offers `bash`
            if step == 0:
                command = json.dumps({"command": task.oracle.command})
                return {"tool_calls": [{"id": "call-0", "name": "bash", "arguments": command}]}
            return self.final(task, step)
        flawed = task.id in self.flaws
        if flawed and task.id == FLAKY and step > 0:  # its oracle is one call: booked at step 0
            return self.final(task, step)
        plan: list[dict[str, Any]] = []
        if flawed and task.id == MALFORMED:
            plan.append({"tool": "mail_teleport", "args": {"to": "the moon"}})
        plan += self.calls(task, flawed)
        if step < len(plan):
            call = plan[step]
            return {"tool_calls": [{"id": f"call-{step}", "name": call["tool"],
                                    "arguments": json.dumps(call["args"])}]}  # fmt: skip
        extra = 1 if flawed and task.id == MALFORMED else 0
        if extra and step == len(task_calls(task)) + extra:
            return {"tool_calls": [{"id": "call-bad-final", "name": "final_answer",
                                    "arguments": "{not json"}]}  # fmt: skip
        return self.final(task, step)

    def final(self, task: ClawTask, step: int) -> dict[str, Any]:
        answer = task.oracle.final_answer or "Done."
        return {"tool_calls": [{"id": f"call-final-{step}", "name": "final_answer",
                                "arguments": json.dumps({"answer": answer})}]}  # fmt: skip

    def shell(
        self, task: ClawTask, step: int, messages: list[dict[str, Any]], tool: str, field: str
    ) -> dict[str, Any]:
        users = "\n".join(_text(m) for m in messages if m.get("role") == "user")
        found = BASE.search(users)
        base = found.group(1) if found else "http://127.0.0.1:7790"
        calls = self.calls(task, False)
        if step < len(calls):
            command = http_call(base, calls[step]["tool"], calls[step]["args"])
            return {"tool_calls": [{"id": f"call-{step}", "name": tool,
                                    "arguments": json.dumps({field: command})}]}  # fmt: skip
        return {"content": task.oracle.final_answer or "Done."}
