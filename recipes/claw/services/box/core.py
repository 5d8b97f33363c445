"""The tool registry, argument checking and the audit log of the in-sandbox services.

Stdlib only: this runs on the image's ``python3`` inside the sandbox, started in well under
a second. Every argument is hostile: it is checked against the tool's JSON schema (the one
the agent is shown, so the two cannot drift) by :func:`check`, a small validator of the
subset of JSON Schema the tools use (types, properties, required, no extra properties,
items, enum, lengths, bounds). We wrote it instead of using ``jsonschema`` because that
package (and its ``rpds-py`` extension) would have to be importable before the first call,
for a dozen flat schemas.

The audit log keeps every call (unknown tools and bad arguments too) in memory only; it is
bounded (:data:`MAX_AUDIT`): a call past the bound is refused with ``audit_full``, never
dropped silently from the log.
"""

from __future__ import annotations

import datetime as dt
import json
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

MAX_AUDIT = 5000
MAX_AUDIT_RESULT = 4096
"""Bytes of a call's result (as JSON) the audit entry keeps."""
MAX_AUDIT_ARGUMENT = 8192
"""Characters of one string argument the audit entry keeps (the rest is summarised)."""
MAX_DEPTH = 8


EMAIL = re.compile(r"^[^@\s,;<>]+@[^@\s,;<>]+\.[^@\s,;<>]+$")


def parse_time(value: str, where: str) -> dt.datetime:
    """An ISO 8601 time from the agent (a naive one is UTC)."""
    try:
        parsed = dt.datetime.fromisoformat(value)
    except ValueError:
        raise ToolError(
            "invalid_arguments",
            f"{where}: {_short(value)!r} is not an ISO 8601 time (e.g. 2026-03-02T14:00:00+00:00)",
        ) from None
    return parsed if parsed.tzinfo is not None else parsed.replace(tzinfo=dt.UTC)


def iso(value: dt.datetime) -> str:
    return value.astimezone(dt.UTC).isoformat().replace("+00:00", "Z")


def check_email(value: str, where: str) -> str:
    if not EMAIL.match(value):
        raise ToolError("invalid_arguments", f"{where}: {_short(value)!r} is not an e-mail address")
    return value


def next_id(prefix: str, taken: set[str] | dict[str, Any]) -> str:
    n = len(taken) + 1
    while f"{prefix}-{n}" in taken:
        n += 1
    return f"{prefix}-{n}"


class ToolError(Exception):
    """A call the agent got wrong (told to it, audited as ``error``): ``code`` is one of
    ``invalid_arguments``, ``not_found``, ``conflict``, ``forbidden``, ``too_large``,
    ``unknown_tool``, ``audit_full``."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message

    def as_dict(self) -> dict[str, str]:
        return {"code": self.code, "message": self.message}


@dataclass
class Call:
    """What a handler gets: the checked arguments and a flag it may raise (a write that
    overwrote an existing file is destructive, a new one is not)."""

    arguments: dict[str, Any]
    destructive: bool = False


Handler = Callable[[Call], Any]


@dataclass(frozen=True)
class Tool:
    name: str
    service: str
    description: str
    parameters: dict[str, Any]
    handler: Handler
    mutating: bool = False
    destructive: bool = False

    def spec(self) -> dict[str, Any]:
        """The OpenAI function-tool form."""
        return {
            "type": "function",
            "function": {
                "name": self.name,
                "description": self.description,
                "parameters": self.parameters,
            },
        }


def schema(properties: dict[str, Any], required: tuple[str, ...] = ()) -> dict[str, Any]:
    """An object schema with no extra properties."""
    return {
        "type": "object",
        "properties": properties,
        "required": list(required),
        "additionalProperties": False,
    }


def string(description: str, max_length: int = 1000, **extra: Any) -> dict[str, Any]:
    return {"type": "string", "description": description, "maxLength": max_length, **extra}


def integer(description: str, minimum: int, maximum: int) -> dict[str, Any]:
    return {"type": "integer", "description": description, "minimum": minimum, "maximum": maximum}


def boolean(description: str) -> dict[str, Any]:
    return {"type": "boolean", "description": description}


def strings(description: str, max_items: int = 50, max_length: int = 320) -> dict[str, Any]:
    return {
        "type": "array",
        "description": description,
        "items": {"type": "string", "maxLength": max_length},
        "maxItems": max_items,
    }


_TYPES: dict[str, Callable[[Any], bool]] = {
    "string": lambda v: isinstance(v, str),
    "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "number": lambda v: isinstance(v, int | float) and not isinstance(v, bool),
    "boolean": lambda v: isinstance(v, bool),
    "array": lambda v: isinstance(v, list),
    "object": lambda v: isinstance(v, dict),
    "null": lambda v: v is None,
}


def check(value: Any, rule: dict[str, Any], where: str = "arguments", depth: int = 0) -> None:
    """Raise ``ToolError("invalid_arguments", ...)`` naming the first field that does not fit."""
    if depth > MAX_DEPTH:
        raise ToolError("invalid_arguments", f"{where}: nested too deeply")
    kinds = rule.get("type")
    if kinds is not None:
        names = kinds if isinstance(kinds, list) else [kinds]
        if not any(_TYPES[k](value) for k in names if k in _TYPES):
            raise ToolError(
                "invalid_arguments", f"{where}: expected {' or '.join(names)}, got {_kind(value)}"
            )
    if "enum" in rule and value not in rule["enum"]:
        raise ToolError("invalid_arguments", f"{where}: must be one of {rule['enum']}")
    if isinstance(value, str):
        if len(value) > rule.get("maxLength", 1 << 20):
            raise ToolError("invalid_arguments", f"{where}: longer than {rule['maxLength']}")
        if len(value) < rule.get("minLength", 0):
            raise ToolError("invalid_arguments", f"{where}: shorter than {rule['minLength']}")
    if isinstance(value, int | float) and not isinstance(value, bool):
        if "minimum" in rule and value < rule["minimum"]:
            raise ToolError("invalid_arguments", f"{where}: below {rule['minimum']}")
        if "maximum" in rule and value > rule["maximum"]:
            raise ToolError("invalid_arguments", f"{where}: above {rule['maximum']}")
    if isinstance(value, list):
        if len(value) > rule.get("maxItems", 1000):
            raise ToolError(
                "invalid_arguments", f"{where}: more than {rule.get('maxItems', 1000)} items"
            )
        if len(value) < rule.get("minItems", 0):
            raise ToolError("invalid_arguments", f"{where}: fewer than {rule['minItems']} items")
        items = rule.get("items")
        if isinstance(items, dict):
            for i, item in enumerate(value):
                check(item, items, f"{where}[{i}]", depth + 1)
    if isinstance(value, dict):
        properties = rule.get("properties", {})
        for name in rule.get("required", ()):
            if name not in value:
                raise ToolError("invalid_arguments", f"{where}: missing {name!r}")
        if rule.get("additionalProperties", True) is False:
            extra = sorted(set(value) - set(properties))
            if extra:
                raise ToolError(
                    "invalid_arguments",
                    f"{where}: unknown field {_short(extra[0])!r} (allowed: {sorted(properties)})",
                )
        for name, item in value.items():
            if name in properties and isinstance(properties[name], dict):
                check(item, properties[name], f"{where}.{name}" if where else name, depth + 1)


def _kind(value: Any) -> str:
    for name, test in _TYPES.items():
        if name != "number" and test(value):
            return name
    return "number" if isinstance(value, float) else type(value).__name__


def _short(text: str, limit: int = 60) -> str:
    return text if len(text) <= limit else text[:limit] + "..."


def cut(value: Any, limit: int = MAX_AUDIT_ARGUMENT, depth: int = 0) -> Any:
    """``value`` with long strings cut (and said so), for the audit log."""
    if isinstance(value, str) and len(value) > limit:
        return value[:limit] + f"... [{len(value) - limit} more characters]"
    if depth > MAX_DEPTH:
        return "[nested too deeply]"
    if isinstance(value, list):
        return [cut(v, limit, depth + 1) for v in value[:200]] + (
            [f"[{len(value) - 200} more items]"] if len(value) > 200 else []
        )
    if isinstance(value, dict):
        return {str(k)[:200]: cut(v, limit, depth + 1) for k, v in list(value.items())[:200]}
    return value


@dataclass
class AuditLog:
    capacity: int = MAX_AUDIT
    entries: list[dict[str, Any]] = field(default_factory=list)
    refused: int = 0
    """Calls refused because the log was full (they did not run)."""

    def full(self) -> bool:
        return len(self.entries) >= self.capacity

    def record(self, **entry: Any) -> None:
        result = entry.get("result")
        if result is not None:
            text = json.dumps(result, ensure_ascii=False, default=str)
            if len(text) > MAX_AUDIT_RESULT:
                entry["result"] = {"truncated": text[:MAX_AUDIT_RESULT], "bytes": len(text)}
        entry["arguments"] = cut(entry.get("arguments"))
        entry["seq"] = len(self.entries) + 1
        entry["time"] = time.time()
        self.entries.append(entry)


class Registry:
    """The offered tools of every service, one lock around every call (the services' state
    is small; calls are milliseconds), and the audit log."""

    def __init__(self, audit_capacity: int = MAX_AUDIT) -> None:
        self.tools: dict[str, Tool] = {}
        self.audit = AuditLog(audit_capacity)
        self.lock = threading.Lock()

    def add(self, tools: list[Tool]) -> None:
        for tool in tools:
            if tool.name in self.tools:
                raise ValueError(f"two tools are named {tool.name!r}")
            self.tools[tool.name] = tool

    def specs(self) -> list[dict[str, Any]]:
        return [t.spec() for t in self.tools.values()]

    def call(
        self, name: str, arguments: Any, channel: str, parse_error: str | None = None
    ) -> dict[str, Any]:
        """Run one call and audit it; the answer is ``{"ok": True, "result": ...}`` or
        ``{"ok": False, "error": {"code", "message"}}``."""
        with self.lock:
            if self.audit.full():
                self.audit.refused += 1
                error = ToolError(
                    "audit_full", f"the audit log holds {self.audit.capacity} calls: no more"
                )
                return {"ok": False, "error": error.as_dict()}
            tool = self.tools.get(name) if isinstance(name, str) else None
            entry: dict[str, Any] = {
                "service": tool.service if tool else "?",
                "operation": _short(str(name), 200),
                "arguments": arguments if isinstance(arguments, dict) else {"<raw>": arguments},
                "mutating": tool.mutating if tool else False,
                "destructive": tool.destructive if tool else False,
                "channel": channel,
            }
            try:
                if tool is None:
                    raise ToolError(
                        "unknown_tool",
                        f"no tool named {_short(str(name))!r}; tools: {', '.join(self.tools)}",
                    )
                if parse_error is not None:
                    raise ToolError("invalid_arguments", parse_error)
                if not isinstance(arguments, dict):
                    raise ToolError("invalid_arguments", "arguments must be a JSON object")
                check(arguments, tool.parameters)
                call = Call(dict(arguments))
                result = tool.handler(call)
                entry["destructive"] = entry["destructive"] or call.destructive
            except ToolError as err:
                self.audit.record(**entry, status="error", error=f"{err.code}: {err.message}")
                return {"ok": False, "error": err.as_dict()}
            except Exception as err:  # a bug of ours: said so, audited, the service lives on
                error = ToolError("internal", f"{type(err).__name__}: {_short(str(err), 300)}")
                self.audit.record(**entry, status="error", error=f"internal: {error.message}")
                return {"ok": False, "error": error.as_dict()}
            self.audit.record(**entry, status="ok", error=None, result=result)
            return {"ok": True, "result": result}
