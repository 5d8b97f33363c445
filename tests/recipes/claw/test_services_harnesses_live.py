"""Real harnesses reach the Claw services over MCP: Codex and OpenClaw from the tools layer,
each in its own sandbox (network ``none`` plus the model endpoint), configured by their
adapters' ``mcp_servers`` option with the services' MCP server (streamable HTTP inside the
sandbox), driven through the recording proxy by a scripted model that calls the MCP tool
the harness itself offered (found by name in the harness's own request) and then finishes.
Codex offers it as one Responses ``namespace`` tool, which the proxy flattens onto Chat
(``mcp__claw__todo_add``) and maps back; OpenClaw defers it behind its ``tool_search`` /
``tool_call`` tools, so the policy searches for it and calls the id found.

The same task yields recorded, trainable samples from both harnesses (graded by the services'
state), and the services' audit log shows each harness's call, channel ``mcp``; the to-do it
added is in the state. Codex's samples are token-exact (the flattened name survives the
history).
(The harnesses' shell route, ``claw <tool> '<json>'`` from their exec tool, is the recipe's
own live test, tests/recipes/claw/test_claw_live.py.)
"""

from __future__ import annotations

import json
import re
import threading
from dataclasses import dataclass, field
from typing import Any

import pytest
from orchard.recipes.claw.services import ClawServices, Fixtures, ServiceOptions, runtime

from orchard import AsyncOrchard, AsyncSandbox
from orchard.rollouts import (
    HarnessRun,
    Limits,
    ModelEndpoint,
    ModelProxyClient,
    SandboxOptions,
    Status,
    Task,
    run_rollout,
)
from orchard.rollouts.harnesses import CliHarness, Codex, McpServer, OpenClaw
from tests.rollouts.conftest import RolloutStack, rollout_stack  # noqa: F401 (the fixture)
from tests.stack import REQUIRES_STACK, TOOLS_DIR

from .sample_fixtures import sample_fixtures

pytestmark = [
    *REQUIRES_STACK,
    pytest.mark.timeout(900),
    pytest.mark.skipif(
        not any(TOOLS_DIR.glob("harnesses-*/layer.json")),
        reason=f"no tools layer under {TOOLS_DIR} (make tools-layer)",
    ),
    pytest.mark.skipif(runtime.find() is None, reason="no runtime: make claw-services"),
]

LIMITS = Limits(max_steps=8, max_seconds=300, command_timeout=60)
MARKER = re.compile(r"\[claw-mcp ([\w-]+)\]")
TITLE = "Buy oat milk"


def _text(message: dict[str, Any]) -> str:
    content = message.get("content") or ""
    if isinstance(content, list):
        return "".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    return str(content)


@dataclass
class McpPolicy:
    """Step 1: call the offered tool whose name ends with ``todo_add`` (where the harness
    defers its MCP tools behind ``tool_search`` / ``tool_call``, find it by search first);
    then, the tool's answer naming the new to-do: finish. Anything else is a 500 (the run
    fails loudly)."""

    answered: dict[str, list[tuple[dict[str, Any], dict[str, Any]]]] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def __call__(self, body: dict[str, Any]) -> dict[str, Any]:
        messages = body.get("messages") or []
        users = " ".join(_text(m) for m in messages if m.get("role") == "user")
        found = MARKER.search(users)
        if found is None:
            return {"content": "ok"}  # a side call of the harness (a title, a summary)
        entry = self.decide(body, messages)
        with self.lock:
            self.answered.setdefault(found.group(1), []).append((body, entry))
        return entry

    def decide(self, body: dict[str, Any], messages: list[dict[str, Any]]) -> dict[str, Any]:
        offered = [t["function"]["name"] for t in body.get("tools") or [] if "function" in t]
        add = [n for n in offered if n.endswith("todo_add")]
        outputs = [_text(m) for m in messages if m.get("role") == "tool"]
        arguments = {"title": TITLE, "priority": "high"}
        if not add and {"tool_search", "tool_call"} <= set(offered):
            return self.by_search(outputs, arguments)
        if not outputs:
            if len(add) != 1:
                return {"status": 500, "content": f"policy: no single *todo_add in {offered}"}
            return {"content": "Adding it.", "tool_calls": [
                {"id": "call_1", "name": add[0], "arguments": json.dumps(arguments)}]}  # fmt: skip
        return self.finish(outputs, 1)

    def by_search(self, outputs: list[str], arguments: dict[str, Any]) -> dict[str, Any]:
        """A harness that defers its MCP tools (OpenClaw): search the catalog for the to-do
        tool, call the id it found through ``tool_call``, then finish."""
        if not outputs:
            return {"content": "Looking for it.", "tool_calls": [{"id": "call_1",
                    "name": "tool_search", "arguments": json.dumps({"query": "todo add"})}]}  # fmt: skip
        if len(outputs) == 1:
            ids = sorted(set(re.findall(r"[\w.:/-]*todo_add\b", outputs[0])))
            if not ids:
                return {
                    "status": 500,
                    "content": f"policy: no todo_add found {outputs[0][-500:]!r}",
                }
            call = json.dumps({"id": ids[0], "args": arguments})
            return {"content": "Adding it.", "tool_calls": [
                {"id": "call_2", "name": "tool_call", "arguments": call}]}  # fmt: skip
        return self.finish(outputs, 2)

    def finish(self, outputs: list[str], calls: int) -> dict[str, Any]:
        if len(outputs) == calls and "todo-" in outputs[-1] and TITLE in outputs[-1]:
            return {"content": f"Added the to-do '{TITLE}'."}
        return {"status": 500, "content": f"policy: unexpected tool output {outputs[-1][-300:]!r}"}


class WithServices:
    """The harness with the Claw services (and their MCP server) started in its sandbox
    first; the handle kept for the test to read the audit log before the sandbox goes."""

    def __init__(self, inner: CliHarness, fixtures: Fixtures) -> None:
        self.inner, self.fixtures = inner, fixtures
        self.name = inner.name
        self.needs_tools_layer = True
        self.audit: list[Any] = []
        self.state: dict[str, Any] = {}

    async def run(
        self, sandbox: AsyncSandbox, task: Task, model: ModelEndpoint, limits: Limits
    ) -> HarnessRun:
        services = await ClawServices.start(sandbox, self.fixtures, ServiceOptions(mcp=True))
        async with services:
            assert services.mcp_url_in_sandbox == next(iter(self.inner.mcp_servers.values())).url
            run = await self.inner.run(sandbox, task, model, limits)
            self.audit = await services.audit()
            self.state = await services.state()
        return run

    async def grade(self, sandbox: AsyncSandbox, task: Task, run: HarnessRun) -> float:
        """1.0 when the services' state (read before they stopped) holds the high-priority
        to-do the task asked for, open; else 0.0. The reward is what makes samples trainable."""
        items = {t["title"]: t for t in self.state.get("todo", {}).get("items", [])}
        wanted = items.get(TITLE) or {}
        return 1.0 if wanted.get("priority") == "high" and not wanted.get("done") else 0.0


@pytest.mark.parametrize(
    "harness",
    [
        pytest.param(Codex, id="codex"),
        pytest.param(OpenClaw, id="openclaw"),
    ],
)
def test_a_real_harness_calls_the_services_over_mcp(
    rollout_stack: RolloutStack,  # noqa: F811
    harness: type[CliHarness],
) -> None:
    policy = McpPolicy()
    rollout_stack.upstream.use(policy)
    name = harness.name
    fixtures = Fixtures(todo=sample_fixtures().todo)
    mcp = {"claw": McpServer(url=f"http://127.0.0.1:{ServiceOptions().mcp_port}/mcp")}
    agent = WithServices(harness(mcp_servers=mcp), fixtures)
    task = Task(
        id=f"claw-mcp-{name}",
        prompt=f"[claw-mcp {name}] Add a high-priority to-do '{TITLE}' with the todo tools.",
        workdir="/workspace",
    )

    async def body(client: AsyncOrchard, proxy: ModelProxyClient) -> None:
        result = await run_rollout(
            client, agent, task, proxy=proxy, model="scripted", limits=LIMITS,
            grade=agent.grade, sandbox=SandboxOptions(memory="2Gi"),
        )  # fmt: skip
        offered_first = [
            [t.get("function", t).get("name") for t in b.get("tools") or []]
            for b, _ in policy.answered.get(name, [])[:1]
        ]
        print(json.dumps({"harness": name, "fault": result.fault, "offered": offered_first}))
        assert result.status is Status.COMPLETED, (result.fault, offered_first,
                                                   result.detail.get("harness"))  # fmt: skip
        assert result.reward == 1.0
        assert result.samples and all(s["trainable"] for s in result.samples)
        calls = await proxy.calls(result.session_id or "")
        assert len(calls) >= 2
        if harness is Codex:  # its MCP tools came as one namespace, flattened by the proxy
            assert all(s["token_exact"] for s in result.samples), result.samples
            named = [c["tool_names"].get("mcp__claw__todo_add") for c in calls]
            assert named[0] == {"namespace": "mcp__claw", "name": "todo_add"}, named
        added = [e for e in agent.audit if e.tool == "todo_add"]
        assert [(e.status, e.channel, e.arguments["title"]) for e in added] == [
            ("ok", "mcp", TITLE)
        ]
        items = {t["title"]: t for t in agent.state["todo"]["items"]}
        assert items[TITLE]["priority"] == "high" and not items[TITLE]["done"]
        offered = [t["function"]["name"] for t in policy.answered[name][0][0].get("tools") or []]
        print(json.dumps({"harness": name, "calls": len(calls), "samples": len(result.samples),
                          "mcp_tools": [t for t in offered if "todo" in t],
                          "called": [(c["name"], c["arguments"]) for _, e in policy.answered[name]
                                     for c in e.get("tool_calls") or ()],
                          "roots": [s["root"]["reason"] for s in result.samples],
                          "token_exact": [s["token_exact"] for s in result.samples],
                          "phases": result.detail["phases"]}))  # fmt: skip

    rollout_stack.run(body)
