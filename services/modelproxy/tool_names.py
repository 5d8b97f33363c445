"""Responses ``namespace`` tools flattened onto Chat function names, and the names mapped back.

A Responses request may group function tools under a namespace (Codex offers each MCP server's
tools so: ``{"type": "namespace", "name": "mcp__claw", "description": ..., "tools": [{"type":
"function", "name": "todo_add", ...}]}``), and the model's call of one names both: a
``function_call`` item with ``"name": "todo_add", "namespace": "mcp__claw"`` (what Codex
dispatches on, and sends back in the history as it got it). Chat has no namespaces, so each
inner tool becomes one Chat function named ``<namespace>__<name>`` (``mcp__claw__todo_add``,
the name Codex itself gives MCP tools where it has no namespaces).

The mapping is a table built from the request's own tools, the same on every turn of a session
(so an earlier call sent back in the history flattens to the name the model produced, and the
samples stay token-exact); it is refused, naming the field, where it would not be one-to-one
or would not fit Chat's name rule ``^[a-zA-Z0-9_-]{1,64}$``: a flattened name over 64
characters or with other characters, one equal to another flattened name or to a top-level
function's name (``a__b`` + ``c`` and ``a`` + ``b__c``), a namespace offered twice, nested
namespaces, ``custom`` tools inside a namespace, a deferred tool (``defer_loading``: Chat has
no tool search), a tool only code may call (``allowed_callers`` without ``direct``), and any
field the translation does not know. Dropped and listed in ``not_carried``: a namespace's
``description`` and an inner tool's ``output_schema`` (Chat has no place for either).
"""

from __future__ import annotations

import re
from typing import Any

from .errors import bad_request, unsupported

SEPARATOR = "__"
CHAT_NAME = re.compile(r"[a-zA-Z0-9_-]{1,64}")
_NAMESPACE_FIELDS = {"type", "name", "description", "tools"}
_INNER_FIELDS = {"type", "name", "description", "parameters", "strict", "defer_loading",
                 "allowed_callers", "output_schema"}  # fmt: skip


def flat_name(namespace: str, name: str) -> str:
    return f"{namespace}{SEPARATOR}{name}"


def _string(value: Any, where: str) -> str:
    if not isinstance(value, str) or not value:
        raise bad_request(f"{where}: expected a non-empty string")
    return value


def _fits_chat(name: str, where: str) -> str:
    if CHAT_NAME.fullmatch(name) is None:
        raise unsupported(
            where,
            f"the Chat function name {name[:80]!r} (namespace{SEPARATOR}name) does not fit "
            "^[a-zA-Z0-9_-]{1,64}$",
        )
    return name


def chat_function(tool: dict[str, Any]) -> dict[str, Any]:
    """A Responses function tool's Chat ``function`` (name set by the caller)."""
    function: dict[str, Any] = {
        "name": tool.get("name"),
        "parameters": tool.get("parameters") or {"type": "object"},
    }
    if tool.get("description"):
        function["description"] = tool["description"]
    if tool.get("strict") is not None:
        function["strict"] = tool["strict"]
    return function


class ToolNames:
    """The request's flattened names: ``chat[flat] = (namespace, name)``, filled by
    ``flatten`` as the request's tools are translated, read back by ``responses_call``."""

    def __init__(self) -> None:
        self.chat: dict[str, tuple[str, str]] = {}
        self._where: dict[str, str] = {}
        """Each Chat function name given so far -> the field it came from."""
        self._namespaces: set[str] = set()

    def _clash(self, name: str, where: str) -> None:
        earlier = self._where.get(name)
        if earlier is not None:
            raise unsupported(
                where, f"the Chat function name {name!r} is also {earlier}'s: not one-to-one"
            )

    def function(self, name: Any, where: str) -> None:
        """A top-level function's name: refused if a flattened tool has it (top-level
        functions that share a name between themselves are the client's affair, as before)."""
        if isinstance(name, str):
            if name in self.chat:
                self._clash(name, where)
            self._where.setdefault(name, where)

    def flatten(
        self, tool: dict[str, Any], where: str, not_carried: list[str]
    ) -> list[dict[str, Any]]:
        """One ``namespace`` tool as Chat function tools, named ``<namespace>__<name>``."""
        for key in tool:
            if key not in _NAMESPACE_FIELDS:
                raise unsupported(f"{where}.{key}", "this namespace field cannot be carried")
        namespace = _string(tool.get("name"), f"{where}.name")
        if namespace in self._namespaces:
            raise unsupported(f"{where}.name", f"the namespace {namespace[:80]!r} is offered twice")
        self._namespaces.add(namespace)
        if tool.get("description"):
            not_carried.append(f"{where}.description")
        inner = tool.get("tools")
        if not isinstance(inner, list):
            raise bad_request(f"{where}.tools: expected a list of tools")
        out: list[dict[str, Any]] = []
        for j, member in enumerate(inner):
            at = f"{where}.tools[{j}]"
            kind = member.get("type") if isinstance(member, dict) else None
            if kind != "function":
                raise unsupported(f"{at}.type", f"{kind!r} tools cannot be carried onto Chat")
            assert isinstance(member, dict)
            for key in member:
                if key not in _INNER_FIELDS:
                    raise unsupported(f"{at}.{key}", "this tool field cannot be carried onto Chat")
            if member.get("defer_loading"):
                raise unsupported(f"{at}.defer_loading", "Chat has no tool search to load it")
            callers = member.get("allowed_callers")
            if callers is not None and (not isinstance(callers, list) or "direct" not in callers):
                raise unsupported(f"{at}.allowed_callers", "the model cannot call it directly")
            if member.get("output_schema") is not None:
                not_carried.append(f"{at}.output_schema")
            name = _string(member.get("name"), f"{at}.name")
            flat = _fits_chat(flat_name(namespace, name), f"{at}.name")
            self._clash(flat, at)
            self._where[flat] = at
            self.chat[flat] = (namespace, name)
            function = chat_function(member)
            function["name"] = flat
            out.append({"type": "function", "function": function})
        return out

    def responses_call(self, chat_name: Any) -> dict[str, Any]:
        """A Chat tool call's name as the Responses ``function_call`` fields: ``name`` and,
        for a flattened tool, its ``namespace``; any other name (a top-level function's, or
        one the model made up) as it is."""
        found = self.chat.get(chat_name) if isinstance(chat_name, str) else None
        if found is None:
            return {"name": chat_name}
        return {"name": found[1], "namespace": found[0]}

    def history_name(self, item: dict[str, Any], where: str) -> str:
        """The Chat name of a ``function_call`` item sent back in the input: flattened as its
        tool was, whether or not the namespace is still offered (the name the model
        produced); refused where that is a top-level function's name now."""
        namespace = item.get("namespace")
        if namespace is None:
            return str(item.get("name", ""))
        namespace = _string(namespace, f"{where}.namespace")
        name = _string(item.get("name"), f"{where}.name")
        flat = _fits_chat(flat_name(namespace, name), f"{where}.namespace")
        if flat in self._where and self.chat.get(flat) != (namespace, name):
            self._clash(flat, where)
        return flat
