"""The generator's :class:`~.backend.TaskBackend` over the Claw recipe itself.

- the format is ``orchard.recipes.claw.tasks`` (``ClawTask.from_json``: a
  ``TaskFormatError`` becomes :class:`~.backend.InvalidTask` with the field and the reason),
  held to :mod:`.policy` as well, and each fixture is checked by the services' own fixture
  model (``orchard.recipes.claw.services``) before any sandbox is spent on it;
- the format reference the build prompt quotes is the format's own JSON schema
  (``task_json_schema``) with a worked example, so the prompt cannot drift from the checks;
- trials are the recipe's runner's (``orchard.recipes.claw.runner``): the oracle harness, the
  null harness (the agent does nothing) and the ReAct loop, each in a fresh sandbox with the
  mock services, graded by the recipe's grader.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Iterable, Mapping
from pathlib import Path
from typing import Any

from orchard.recipes.claw import services as claw_services
from orchard.recipes.claw.tasks import (
    PASS_THRESHOLD,
    SERVICES,
    ClawTask,
    TaskFormatError,
    load_tasks,
    task_json_schema,
)
from pydantic import ValidationError

from . import policy
from .backend import InvalidTask

TOOLS: Mapping[str, tuple[str, ...]] = {
    "mail": ("list", "search", "read", "send", "reply", "delete", "move"),
    "calendar": ("list", "create", "update", "delete", "freebusy"),
    "contacts": ("search", "get", "create", "update"),
    "files": ("list", "read", "write", "delete"),
    "todo": ("list", "add", "complete", "delete"),
    "search": ("search", "fetch"),
}
"""The operations of each service's tools (``<service>_<operation>``), from the services'
fixture table (``orchard.recipes.claw.services.fixtures``)."""

FIXTURE_MODELS: Mapping[str, Any] = {
    "mail": claw_services.MailFixture,
    "calendar": claw_services.CalendarFixture,
    "contacts": claw_services.ContactsFixture,
    "files": claw_services.FilesFixture,
    "todo": claw_services.TodoFixture,
    "search": claw_services.WebFixture,
}
"""The services' fixture model of each task service (``search`` is the services' ``web``)."""

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


def _fixture_schema(model: Any) -> str:
    return json.dumps(model.model_json_schema(), separators=(",", ":"))


class ClawFormat:
    """The format half of the backend: parse, dump, describe (no sandbox needed)."""

    pass_threshold = PASS_THRESHOLD

    def services(self) -> Collection[str]:
        return SERVICES

    def capabilities(self) -> str:
        lines = []
        for name in SERVICES:
            tools = ", ".join(f"{name}_{op}" for op in TOOLS.get(name, ()))
            lines.append(f"- {name}: tools {tools}")
        return "\n".join(lines)

    def format_reference(self) -> str:
        fixtures = "\n".join(
            f"- fixtures.{name}: {_fixture_schema(model)}" for name, model in FIXTURE_MODELS.items()
        )
        return (
            "A task is a JSON object following this JSON schema:\n"
            + json.dumps(task_json_schema(), separators=(",", ":"))
            + "\n\nEach service's fixture (what it holds when the task starts) follows its own "
            "schema:\n"
            + fixtures
            + "\n\nThe tools the agent (and a tool_calls oracle) calls are named "
            "<service>_<operation>:\n"
            + self.capabilities()
            + "\n\nGenerated tasks leave environment.image unset, keep every regex short and "
            "without nested quantifiers, and use only the services they list.\n\n"
            "An example of a complete task:\n" + json.dumps(EXAMPLE, indent=1)
        )

    def parse(self, data: Mapping[str, Any]) -> ClawTask:
        policy.check(data)
        try:
            task = ClawTask.from_json(dict(data))
        except TaskFormatError as err:
            raise InvalidTask(f"{err.field}: {err.reason}") from None
        for name, fixture in task.fixtures.items():
            model = FIXTURE_MODELS.get(name)
            if model is None:
                continue
            try:
                model.model_validate(fixture)
            except ValidationError as err:
                first = err.errors()[0]
                where = ".".join(str(p) for p in first["loc"])
                raise InvalidTask(f"fixtures.{name}.{where}: {first['msg']}") from None
        return task

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
