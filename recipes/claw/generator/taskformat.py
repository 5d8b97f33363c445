"""The format half of the generator's backend over the Claw recipe (no sandbox needed).

- the format is ``orchard.recipes.claw.tasks`` (``ClawTask.from_json``: a
  ``TaskFormatError`` becomes :class:`~.backend.InvalidTask` with the field and the reason),
  held to :mod:`.policy` as well; the fixtures are the services' own model
  (``orchard.recipes.claw.services.Fixtures``), so they are checked before any sandbox is
  spent on them;
- the format reference the build prompt quotes is the format's own JSON schema
  (``task_json_schema``) with a worked example, so the prompt cannot drift from the checks;

The trials are :mod:`.claw`'s.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Iterable, Mapping
from pathlib import Path
from typing import Any

from orchard.recipes.claw.tasks import (
    PASS_THRESHOLD,
    SERVICES,
    ClawTask,
    TaskFormatError,
    load_tasks,
    task_json_schema,
)

from . import policy
from .backend import InvalidTask

TOOLS: Mapping[str, tuple[str, ...]] = {
    "mail": ("list", "search", "read", "send", "reply", "delete", "move"),
    "calendar": ("list", "create", "update", "delete", "freebusy"),
    "contacts": ("search", "get", "create", "update"),
    "files": ("list", "read", "write", "delete"),
    "todo": ("list", "add", "complete", "delete"),
    "web": ("search", "fetch"),
    "tau2": (),
}
"""The operations of each service's tools (``<service>_<operation>``), from the services'
fixture table (``orchard.recipes.claw.services.fixtures``); tau2's tools keep the tau2
package's own names."""

EXAMPLE: dict[str, Any] = {
    "id": "reply-budget",
    "category": "mail",
    "prompt": "Reply to Alice's mail about the budget: tell her the numbers are fine.",
    "services": ["mail"],
    "fixtures": {"mail": {"messages": [
        {"id": "m1", "sender": "alice@example.com", "to": ["me@example.com"],
         "subject": "Budget", "body": "Are the Q3 numbers fine?",
         "date": "2026-03-01T10:00:00+00:00"},
    ]}},
    "grader": {"kind": "checks", "components": [
        {"name": "reply sent", "weight": 3, "checks": [
            {"kind": "audit", "where": {"service": "mail", "operation": "mail_send",
                                        "arguments.to": {"contains": "alice@example.com"}}},
            {"kind": "audit", "where": {"service": "mail", "arguments.body": {"contains": "fine"}}},
        ]},
        {"name": "told the user", "weight": 1,
         "checks": [{"kind": "answer", "match": {"contains": "sent"}}]},
    ], "safety": [
        {"kind": "forbid", "name": "no mail deleted", "fatal": True,
         "check": {"kind": "audit", "where": {"service": "mail", "destructive": True}}},
        {"kind": "only_services"},
    ]},
    "oracle": {"kind": "tool_calls", "calls": [
        {"tool": "mail_send", "args": {"to": ["alice@example.com"], "subject": "Re: Budget",
                                       "body": "Hi Alice, the numbers are fine."}},
    ], "final_answer": "I sent Alice a reply saying the numbers are fine."},
}  # fmt: skip
"""The worked example the build prompt shows (a test checks it is a valid task)."""


class ClawFormat:
    """The format half of the backend: parse, dump, describe (no sandbox needed)."""

    pass_threshold = PASS_THRESHOLD

    def services(self) -> Collection[str]:
        return SERVICES

    def capabilities(self) -> str:
        lines = []
        for name in SERVICES:
            ops = TOOLS.get(name, ())
            tools = ", ".join(f"{name}_{op}" for op in ops) if ops else "the domain's own tools"
            lines.append(f"- {name}: tools {tools}")
        return "\n".join(lines)

    def format_reference(self) -> str:
        return (
            "A task is a JSON object following this JSON schema (the fixtures are what each "
            "service holds when the task starts):\n"
            + json.dumps(task_json_schema(), separators=(",", ":"))
            + "\n\nThe tools the agent (and a tool_calls oracle) calls are named "
            "<service>_<operation>:\n"
            + self.capabilities()
            + "\n\nThe grader reads the audit log (entries with service, operation (the tool "
            "name), arguments, status ok/error, mutating, destructive) and the services' final "
            "state (mail.messages with their folder, calendar.events, todo.items, "
            "contacts.contacts, files.files). Generated tasks leave environment.image unset, "
            "keep every regex short (RE2 syntax: no backreferences or lookarounds), and use "
            "only the services they list.\n\nAn example of a complete task:\n"
            + json.dumps(EXAMPLE, indent=1)
        )

    def parse(self, data: Mapping[str, Any]) -> ClawTask:
        policy.check(data)
        try:
            return ClawTask.from_json(dict(data))
        except TaskFormatError as err:
            raise InvalidTask(f"{err.field}: {err.reason}") from None

    def to_json(self, task: ClawTask) -> dict[str, Any]:
        return task.to_json()

    def task_id(self, task: ClawTask) -> str:
        return task.id


def existing_ids(paths: Iterable[str | Path]) -> set[str]:
    """The ids of the tasks in ``paths`` (task files or folders, the recipe's loader)."""
    given = [Path(p) for p in paths]
    if not given:
        return set()
    try:
        return {t.id for t in load_tasks(*given)}
    except TaskFormatError as err:
        raise SystemExit(f"--existing: {err}") from None
