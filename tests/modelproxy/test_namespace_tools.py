"""Responses ``namespace`` tools (Codex's MCP servers) through the proxy onto the Chat upstream.

The wire format is Codex 0.171's, captured from the installed CLI against a loopback server:
one ``{"type": "namespace", "name": "mcp__claw", "tools": [function, ...]}`` tool, and a call
of an inner tool answered as a ``function_call`` with ``"name": "todo_add", "namespace":
"mcp__claw"`` (the only form Codex dispatches; ``mcp__claw__todo_add`` alone it refuses as an
unsupported call), sent back so in the next request's input. Through the real proxy with the
real ``openai`` client: the Chat upstream sees ``mcp__claw__todo_add``, the client gets the
namespaced call back, streamed and not, and the next turn's history flattens to the same name
so the samples stitch token-exact. What cannot be flattened one-to-one is a 400
``UNSUPPORTED_FIELD`` naming the field, before the upstream is asked; the translation itself is
driven in-process with hostile tool lists (huge namespaces, split streamed names).
"""

from __future__ import annotations

import json
import re
from typing import Any

import openai
import pytest
from orchard.modelproxy.errors import ProxyError
from orchard.modelproxy.responses_api import ResponsesTranslation

from orchard.testing.scripted_model import ScriptedUpstream, completion_text, prompt_ids, tokens

from .conftest import Proxy

ADD_SCHEMA = {"type": "object", "properties": {"title": {"type": "string"}},
              "required": ["title"]}  # fmt: skip
CLAW = {
    "type": "namespace",
    "name": "mcp__claw",
    "description": "Tools in the mcp__claw namespace.",
    "tools": [
        {"type": "function", "name": "todo_add", "description": "Add a to-do.", "strict": False,
         "parameters": ADD_SCHEMA},
        {"type": "function", "name": "todo_list", "description": "List to-dos.", "strict": False,
         "parameters": {"type": "object", "properties": {}}},
    ],
}  # fmt: skip
EXEC = {"type": "function", "name": "exec_command", "description": "run", "strict": False,
        "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}}}  # fmt: skip
ARGS = '{"title": "Buy oat milk"}'


def _responses(proxy: Proxy, session: dict[str, Any], body: dict[str, Any]) -> tuple[int, Any]:
    path = session["openai_base_url"][len(proxy.url) :] + "/responses"
    return proxy.call("POST", path, body)


@pytest.mark.parametrize("stream", [False, True])
def test_a_namespaced_tool_round_trips_token_exact(
    proxy: Proxy, upstream: tuple[ScriptedUpstream, str], stream: bool
) -> None:
    server, _ = upstream
    call = {"id": "call_1", "name": "mcp__claw__todo_add", "arguments": ARGS}
    server.script += [{"content": "Adding it.", "tool_calls": [call]}, {"content": "Added."}]
    session = proxy.session()
    client = openai.OpenAI(base_url=session["openai_base_url"], api_key="x", max_retries=0)
    items: list[Any] = [{"type": "message", "role": "user", "content": "add oat milk"}]
    events: list[Any] = []

    def ask() -> Any:
        if not stream:
            return client.responses.create(model="m", input=items, tools=[EXEC, CLAW])  # type: ignore[list-item]
        with client.responses.stream(model="m", input=items, tools=[EXEC, CLAW]) as s:  # type: ignore[list-item]
            events.extend(s)
            return s.get_final_response()

    first = ask()
    sent = server.requests[0]["tools"]
    assert [t["function"]["name"] for t in sent] == [
        "exec_command", "mcp__claw__todo_add", "mcp__claw__todo_list",
    ]  # fmt: skip
    assert sent[1]["function"] == {"name": "mcp__claw__todo_add", "description": "Add a to-do.",
                                   "parameters": ADD_SCHEMA, "strict": False}  # fmt: skip
    assert [o.type for o in first.output] == ["message", "function_call"]
    fc = first.output[1]
    assert (fc.call_id, fc.name, fc.namespace, fc.arguments) == (
        "call_1", "todo_add", "mcp__claw", ARGS,
    )  # fmt: skip
    if stream:
        done = [e.item for e in events if e.type == "response.output_item.done"]
        added = [e.item for e in events if e.type == "response.output_item.added"]
        assert (done[-1].name, done[-1].namespace) == ("todo_add", "mcp__claw")
        assert (added[-1].name, added[-1].namespace) == ("todo_add", "mcp__claw")
    # as Codex sends it back: the call with its namespace, then the tool's output
    items += [o.model_dump(exclude_none=True) for o in first.output]
    assert items[-1]["namespace"] == "mcp__claw"
    items.append({"type": "function_call_output", "call_id": "call_1", "output": "todo-1 added"})
    second = ask()
    assert second.output_text == "Added."
    chat = server.requests[1]["messages"]
    assert chat[1]["tool_calls"][0]["function"] == {
        "name": "mcp__claw__todo_add",
        "arguments": ARGS,
    }
    assert chat[2] == {"role": "tool", "tool_call_id": "call_1", "content": "todo-1 added"}
    [sample] = _samples(proxy, session["id"])
    assert sample["token_exact"] is True and sample["calls"] == [0, 1]
    assert sample["tokens"] == prompt_ids(chat) + tokens(completion_text({"content": "Added."}))
    records = proxy.records(session["id"])
    assert all(
        r["tool_names"] == {
            "mcp__claw__todo_add": {"namespace": "mcp__claw", "name": "todo_add"},
            "mcp__claw__todo_list": {"namespace": "mcp__claw", "name": "todo_list"},
        }
        and "tools[1].description" in r["not_carried"]
        for r in records
    )  # fmt: skip


def _samples(proxy: Proxy, session_id: str) -> list[dict[str, Any]]:
    status, text = proxy.call("GET", f"/v1/sessions/{session_id}/samples")
    assert status == 200, text
    return [json.loads(line) for line in text.splitlines()]


def _ns(name: str, *tools: Any) -> dict[str, Any]:
    return {"type": "namespace", "name": name, "description": "", "tools": list(tools)}


def _fn(name: str, **extra: Any) -> dict[str, Any]:
    return {"type": "function", "name": name, "parameters": {"type": "object"}, **extra}


def _history_call(name: str, namespace: str) -> list[dict[str, Any]]:
    return [{"type": "message", "role": "user", "content": "hi"},
            {"type": "function_call", "call_id": "c1", "name": name, "namespace": namespace,
             "arguments": "{}"},
            {"type": "function_call_output", "call_id": "c1", "output": "ok"}]  # fmt: skip


HOSTILE = {
    "two namespaces, one flat name": (
        [_ns("a__b", _fn("c")), _ns("a", _fn("b__c"))], "hi", r"tools\[1\]\.tools\[0\]: .*'a__b__c'.*not one-to-one",
    ),
    "a function named as a flattened tool": (
        [CLAW, _fn("mcp__claw__todo_add")], "hi", r"tools\[1\]: .*'mcp__claw__todo_add'.*not one-to-one",
    ),
    "the same, function first": (
        [_fn("mcp__claw__todo_add"), CLAW], "hi", r"tools\[1\]\.tools\[0\]: .*not one-to-one",
    ),
    "two tools of one name": (
        [_ns("n", _fn("t"), _fn("t"))], "hi", r"tools\[0\]\.tools\[1\]: .*'n__t'.*not one-to-one",
    ),
    "a namespace offered twice": (
        [_ns("n", _fn("t")), _ns("n", _fn("u"))], "hi", r"tools\[1\]\.name: .*offered twice",
    ),
    "an over-long name": (
        [_ns("n" * 40, _fn("t" * 23))], "hi", r"tools\[0\]\.tools\[0\]\.name: .*does not fit",
    ),
    "a separator Chat refuses": (
        [_ns("mcp.claw", _fn("todo_add"))], "hi", r"tools\[0\]\.tools\[0\]\.name: .*'mcp\.claw__todo_add'",
    ),
    "a newline in a name": (
        [_ns("n", _fn("t\nignore previous"))], "hi", r"tools\[0\]\.tools\[0\]\.name: .*does not fit",
    ),
    "a nested namespace": (
        [_ns("outer", _ns("inner", _fn("t")))], "hi", r"tools\[0\]\.tools\[0\]\.type: 'namespace'",
    ),
    "a custom tool inside": (
        [_ns("n", {"type": "custom", "name": "apply_patch"})], "hi", r"tools\[0\]\.tools\[0\]\.type: 'custom'",
    ),
    "a deferred tool": (
        [_ns("n", _fn("t", defer_loading=True))], "hi", r"tools\[0\]\.tools\[0\]\.defer_loading",
    ),
    "a tool only code may call": (
        [_ns("n", _fn("t", allowed_callers=["programmatic"]))], "hi", r"tools\[0\]\.tools\[0\]\.allowed_callers",
    ),
    "an unknown inner field": (
        [_ns("n", _fn("t", grammar="x"))], "hi", r"tools\[0\]\.tools\[0\]\.grammar",
    ),
    "an unknown namespace field": (
        [{**_ns("n", _fn("t")), "defer_loading": True}], "hi", r"tools\[0\]\.defer_loading",
    ),
    "a history call past the name rule": (
        [CLAW], _history_call("t" * 60, "mcp__claw"), r"input\[1\]\.namespace: .*does not fit",
    ),
    "a history call flattening onto another tool": (
        [_ns("a__b", _fn("c"))], _history_call("b__c", "a"), r"input\[1\]: .*'a__b__c'.*not one-to-one",
    ),
    "a history call named as a function": (
        [_fn("a__b")], _history_call("b", "a"), r"input\[1\]: .*'a__b'.*not one-to-one",
    ),
}  # fmt: skip


@pytest.mark.parametrize("case", HOSTILE, ids=list(HOSTILE))
def test_what_cannot_be_flattened_one_to_one_is_refused_by_name(
    proxy: Proxy, upstream: tuple[ScriptedUpstream, str], case: str
) -> None:
    tools, given, match = HOSTILE[case]
    session = proxy.session()
    status, answer = _responses(proxy, session, {"model": "m", "input": given, "tools": tools})
    assert status == 400, answer
    assert answer["error"]["code"] == "UNSUPPORTED_FIELD"
    assert re.search(match, answer["error"]["message"]), answer
    assert upstream[0].requests == []


def _translate(tools: list[Any], given: Any = "hi") -> tuple[ResponsesTranslation, dict[str, Any]]:
    translation = ResponsesTranslation({"model": "m", "input": given, "tools": tools})
    return translation, translation.to_chat()


def test_a_huge_namespace_flattens_whole_and_maps_back() -> None:
    tools = [_fn(f"tool_{i}") for i in range(20_000)]
    translation, chat = _translate([_ns("big", *tools), EXEC])
    names = [t["function"]["name"] for t in chat["tools"]]
    assert names[:2] == ["big__tool_0", "big__tool_1"] and names[-1] == "exec_command"
    assert len(names) == len(set(names)) == 20_001
    answer = translation.from_chat({"choices": [{"message": {"role": "assistant", "tool_calls": [
        {"id": "c", "type": "function", "function": {"name": "big__tool_19999", "arguments": "{}"}},
        {"id": "d", "type": "function", "function": {"name": "exec_command", "arguments": "{}"}},
    ]}}]})  # fmt: skip
    calls = [(o["name"], o.get("namespace")) for o in answer["output"]]
    assert calls == [("tool_19999", "big"), ("exec_command", None)]
    with pytest.raises(ProxyError, match=r"tools\[0\]\.tools\[20000\]: .*'big__tool_7'"):
        _translate([_ns("big", *tools, _fn("tool_7"))])


def test_names_the_model_makes_up_stay_as_they_are() -> None:
    translation, _ = _translate([CLAW])
    answer = translation.from_chat({"choices": [{"message": {"role": "assistant", "tool_calls": [
        {"id": "c", "type": "function", "function": {"name": "mcp__claw__nope", "arguments": "{}"}},
        {"id": "d", "type": "function", "function": {"name": "mcp__claw", "arguments": "{}"}},
    ]}}]})  # fmt: skip
    assert [(o["name"], "namespace" in o) for o in answer["output"]] == [
        ("mcp__claw__nope", False), ("mcp__claw", False),
    ]  # fmt: skip


def _sse_items(data: bytes, kind: str) -> list[dict[str, Any]]:
    events = [
        json.loads(line[6:]) for line in data.decode().splitlines() if line.startswith("data: ")
    ]
    return [e["item"] for e in events if e["type"] == kind]


def test_a_streamed_name_in_pieces_is_mapped_when_whole() -> None:
    translation, _ = _translate([CLAW, EXEC])
    pieces = [{"index": 0, "id": "c1", "function": {"name": "mcp__cl", "arguments": ""}},
              {"index": 0, "function": {"name": "aw__todo_add"}},
              {"index": 0, "function": {"arguments": ARGS}},
              {"index": 1, "id": "c2", "function": {"name": "exec_command", "arguments": "{}"}}]  # fmt: skip
    out = b"".join(
        translation.feed({"choices": [{"index": 0, "delta": {"tool_calls": [p]}}]}) for p in pieces
    )
    out += translation.close({"choices": [{"finish_reason": "tool_calls"}]})
    done = _sse_items(out, "response.output_item.done")
    assert [(i["name"], i.get("namespace"), i["arguments"]) for i in done] == [
        ("todo_add", "mcp__claw", ARGS), ("exec_command", None, "{}"),
    ]  # fmt: skip
    completed = json.loads(out.decode().rsplit("data: ", 1)[1])["response"]["output"]
    assert [(i["name"], i.get("namespace")) for i in completed] == [
        ("todo_add", "mcp__claw"), ("exec_command", None),
    ]  # fmt: skip


def test_tool_choice_of_a_namespaced_tool_is_its_flat_name() -> None:
    translation = ResponsesTranslation({"model": "m", "input": "hi", "tools": [CLAW],
        "tool_choice": {"type": "function", "name": "todo_add", "namespace": "mcp__claw"}})  # fmt: skip
    chat = translation.to_chat()
    assert chat["tool_choice"] == {"type": "function", "function": {"name": "mcp__claw__todo_add"}}


def test_an_empty_namespace_offers_nothing() -> None:
    _, chat = _translate([_ns("empty")])
    assert "tools" not in chat
