"""The to-do service: list, add, complete, delete."""

from __future__ import annotations

import copy
import datetime as dt
from typing import Any

from .core import Call, Tool, ToolError, next_id, schema, string

MAX_ITEMS = 10_000


class Todos:
    service = "todo"

    def __init__(self, fixture: dict[str, Any], now: dt.datetime) -> None:
        self.now = now
        self.items: dict[str, dict[str, Any]] = {}
        for t in fixture.get("items") or []:
            self.items[t["id"]] = {
                "id": t["id"],
                "title": t["title"],
                "notes": t.get("notes", ""),
                "due": t.get("due"),
                "priority": t.get("priority", "normal"),
                "done": bool(t.get("done", False)),
            }

    def _get(self, todo_id: str) -> dict[str, Any]:
        item = self.items.get(todo_id)
        if item is None:
            raise ToolError("not_found", f"no to-do with id {todo_id!r}")
        return item

    def listing(self, call: Call) -> dict[str, Any]:
        status = call.arguments.get("status", "open")
        found = [
            dict(t)
            for t in self.items.values()
            if status == "all" or t["done"] == (status == "done")
        ]
        found.sort(key=lambda t: (t["due"] or "9999", t["id"]))
        return {"status": status, "total": len(found), "items": found[:500]}

    def add(self, call: Call) -> dict[str, Any]:
        a = call.arguments
        if len(self.items) >= MAX_ITEMS:
            raise ToolError("too_large", f"the list holds {MAX_ITEMS} items: no more")
        due = a.get("due")
        if due is not None:
            try:
                due = dt.date.fromisoformat(due).isoformat()
            except ValueError:
                raise ToolError(
                    "invalid_arguments", f"due: {due[:40]!r} is not a date (YYYY-MM-DD)"
                ) from None
        if not a["title"].strip():
            raise ToolError("invalid_arguments", "title: must not be empty")
        item = {"id": next_id("todo", self.items), "title": a["title"], "notes": a.get("notes", ""),
                "due": due, "priority": a.get("priority", "normal"), "done": False}  # fmt: skip
        self.items[item["id"]] = item
        return dict(item)

    def complete(self, call: Call) -> dict[str, Any]:
        item = self._get(call.arguments["todo_id"])
        if item["done"]:
            raise ToolError("conflict", f"to-do {item['id']!r} is done already")
        item["done"] = True
        return dict(item)

    def delete(self, call: Call) -> dict[str, Any]:
        item = self._get(call.arguments["todo_id"])
        del self.items[item["id"]]
        return {"id": item["id"], "deleted": True, "title": item["title"]}

    def state(self) -> dict[str, Any]:
        return {"items": copy.deepcopy(sorted(self.items.values(), key=lambda t: t["id"]))}

    def tools(self) -> list[Tool]:
        tid = string("The to-do's id (from todo_list).", 128)
        return [
            Tool("todo_list", self.service, "List to-dos (open ones by default), by due date.",
                 schema({"status": string("open, done or all.", 8, enum=["open", "done", "all"])}),
                 self.listing),
            Tool("todo_add", self.service, "Add a to-do.",
                 schema({"title": string("What to do.", 500, minLength=1),
                         "notes": string("Notes.", 20_000),
                         "due": string("Due date, YYYY-MM-DD.", 10),
                         "priority": string("low, normal or high.", 8, enum=["low", "normal", "high"])},
                        ("title",)),
                 self.add, mutating=True),
            Tool("todo_complete", self.service, "Mark a to-do done.",
                 schema({"todo_id": tid}, ("todo_id",)), self.complete, mutating=True),
            Tool("todo_delete", self.service, "Delete a to-do.",
                 schema({"todo_id": tid}, ("todo_id",)), self.delete, mutating=True, destructive=True),
        ]  # fmt: skip
