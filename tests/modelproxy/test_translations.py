"""Anthropic Messages and OpenAI Responses through the proxy with the real ``anthropic`` and
``openai`` clients: text, tool calls and tool results both ways, streamed and not, onto the
scripted Chat upstream; what cannot be carried is a 400 naming the field; the samples of a
translated session stitch token-exact like a Chat one."""

from __future__ import annotations

import json
from typing import Any

import anthropic
import openai
import pytest

from orchard.testing.scripted_model import ScriptedUpstream, completion_text, prompt_ids, tokens

from .conftest import Proxy

CALL = {"id": "toolu_1", "name": "run", "arguments": '{"cmd": "pytest -q"}'}
SCHEMA = {"type": "object", "properties": {"cmd": {"type": "string"}}}


def _samples(proxy: Proxy, session_id: str) -> list[dict[str, Any]]:
    status, text = proxy.call("GET", f"/v1/sessions/{session_id}/samples")
    assert status == 200, text
    return [json.loads(line) for line in text.splitlines()]


@pytest.mark.parametrize("stream", [False, True])
def test_messages_tool_round_trip(
    proxy: Proxy, upstream: tuple[ScriptedUpstream, str], stream: bool
) -> None:
    server, _ = upstream
    server.script += [{"content": "running tests", "tool_calls": [CALL]}, {"content": "all green"}]
    session = proxy.session()
    client = anthropic.Anthropic(base_url=session["anthropic_base_url"], api_key="x", max_retries=0)
    tools = [{"name": "run", "description": "run a command", "input_schema": SCHEMA}]
    messages: list[dict[str, Any]] = [{"role": "user", "content": "fix the tests"}]

    def ask() -> Any:
        if not stream:
            return client.messages.create(model="m", max_tokens=100, system="be brief",
                                          messages=messages, tools=tools)  # type: ignore[arg-type]  # fmt: skip
        with client.messages.stream(model="m", max_tokens=100, system="be brief",
                                    messages=messages, tools=tools) as s:  # type: ignore[arg-type]  # fmt: skip
            return s.get_final_message()

    first = ask()
    assert first.stop_reason == "tool_use"
    assert [b.type for b in first.content] == ["text", "tool_use"]
    assert first.content[0].text == "running tests"
    use = first.content[1]
    assert (use.id, use.name, use.input) == ("toolu_1", "run", {"cmd": "pytest -q"})
    messages.append(
        {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in first.content]}
    )
    messages.append({"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": "toolu_1", "content": "1 passed"}]})  # fmt: skip
    second = ask()
    assert second.content[0].text == "all green" and second.stop_reason == "end_turn"
    chat = server.requests[1]["messages"]
    assert chat[0] == {"role": "system", "content": "be brief"}
    assert chat[2]["tool_calls"][0]["function"] == {
        "name": "run",
        "arguments": json.dumps({"cmd": "pytest -q"}),
    }
    assert chat[3] == {"role": "tool", "tool_call_id": "toolu_1", "content": "1 passed"}
    assert server.requests[0]["tools"][0]["function"]["parameters"] == SCHEMA
    samples = _samples(proxy, session["id"])
    assert len(samples) == 1 and samples[0]["token_exact"] is True
    assert samples[0]["tokens"][-len(tokens("all green</s>")) :] == tokens("all green</s>")


def test_messages_what_cannot_be_carried_is_named(
    proxy: Proxy, upstream: tuple[ScriptedUpstream, str]
) -> None:
    session = proxy.session()
    client = anthropic.Anthropic(base_url=session["anthropic_base_url"], api_key="x", max_retries=0)
    with pytest.raises(anthropic.BadRequestError, match="redacted_thinking"):
        client.messages.create(model="m", max_tokens=10, messages=[
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": [{"type": "redacted_thinking", "data": "xx"}]},
            {"role": "user", "content": "again"}])  # fmt: skip
    with pytest.raises(anthropic.BadRequestError, match="thinking"):
        client.messages.create(model="m", max_tokens=10, messages=[{"role": "user", "content": "hi"}],
                               thinking={"type": "enabled", "budget_tokens": 1024})  # fmt: skip
    with pytest.raises(anthropic.BadRequestError, match=r"tools\[0\]\.type"):
        client.messages.create(model="m", max_tokens=10, messages=[{"role": "user", "content": "hi"}],
                               tools=[{"type": "web_search_20250305", "name": "web_search"}])  # type: ignore[list-item]  # fmt: skip
    assert server_untouched(upstream)


def server_untouched(upstream: tuple[ScriptedUpstream, str]) -> bool:
    return upstream[0].requests == []


@pytest.mark.parametrize("stream", [False, True])
def test_responses_tool_round_trip(
    proxy: Proxy, upstream: tuple[ScriptedUpstream, str], stream: bool
) -> None:
    server, _ = upstream
    call = {"id": "call_7", "name": "shell", "arguments": '{"cmd":["ls"]}'}
    server.script += [{"content": "looking", "tool_calls": [call]}, {"content": "done, fixed"}]
    session = proxy.session()
    client = openai.OpenAI(base_url=session["openai_base_url"], api_key="x", max_retries=0)
    tools = [{"type": "function", "name": "shell", "description": "run", "parameters": SCHEMA}]
    items: list[Any] = [{"type": "message", "role": "developer", "content": "be careful"},
                        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "fix it"}]}]  # fmt: skip

    def ask() -> Any:
        if not stream:
            return client.responses.create(
                model="m", instructions="you are codex", input=items, tools=tools
            )  # type: ignore[arg-type]
        with client.responses.stream(
            model="m", instructions="you are codex", input=items, tools=tools
        ) as s:  # type: ignore[arg-type]
            deltas = [e.delta for e in s if e.type == "response.output_text.delta"]
            final = s.get_final_response()
        assert "".join(deltas) == final.output_text
        return final

    first = ask()
    kinds = [o.type for o in first.output]
    assert kinds == ["message", "function_call"]
    assert first.output_text == "looking"
    fc = first.output[1]
    assert (fc.call_id, fc.name, fc.arguments) == ("call_7", "shell", '{"cmd":["ls"]}')
    items += [o.model_dump(exclude_none=True) for o in first.output]
    items.append({"type": "function_call_output", "call_id": "call_7", "output": "calc.py"})
    second = ask()
    assert second.output_text == "done, fixed" and second.status == "completed"
    chat = server.requests[1]["messages"]
    assert chat[:2] == [
        {"role": "system", "content": "you are codex"},
        {"role": "system", "content": "be careful"},
    ]
    assert chat[3]["content"] == "looking" and chat[3]["tool_calls"][0]["id"] == "call_7"
    assert chat[4] == {"role": "tool", "tool_call_id": "call_7", "content": "calc.py"}
    [sample] = _samples(proxy, session["id"])
    assert sample["token_exact"] is True and sample["calls"] == [0, 1]
    expected = prompt_ids(chat) + tokens(completion_text({"content": "done, fixed"}))
    assert sample["tokens"] == expected


def test_responses_what_cannot_be_carried_is_named(
    proxy: Proxy, upstream: tuple[ScriptedUpstream, str]
) -> None:
    session = proxy.session()
    client = openai.OpenAI(base_url=session["openai_base_url"], api_key="x", max_retries=0)
    with pytest.raises(openai.BadRequestError, match="previous_response_id"):
        client.responses.create(model="m", input="hi", previous_response_id="resp_1")
    with pytest.raises(openai.BadRequestError, match=r"tools\[0\]\.type"):
        client.responses.create(model="m", input="hi", tools=[{"type": "web_search"}])  # type: ignore[list-item]
    with pytest.raises(openai.BadRequestError, match=r"input\[0\]\.type"):
        client.responses.create(model="m", input=[{"type": "local_shell_call", "id": "x", "call_id": "y",
                                                   "action": {"type": "exec", "command": ["ls"], "env": {}}, "status": "completed"}])  # type: ignore[list-item]  # fmt: skip
    assert server_untouched(upstream)
    upstream[0].script.append({"content": "ok"})
    client.responses.create(
        model="m", input="hi", store=False, include=["reasoning.encrypted_content"]
    )
    [record] = proxy.records(session["id"])
    assert sorted(record["not_carried"]) == ["include", "store"]


@pytest.mark.parametrize("stream", [False, True])
def test_reasoning_reaches_each_format(
    proxy: Proxy, upstream: tuple[ScriptedUpstream, str], stream: bool
) -> None:
    server, _ = upstream
    server.script += [{"reasoning": "add() subtracts", "content": "fix add"} for _ in range(2)]
    session = proxy.session()
    oai = openai.OpenAI(base_url=session["openai_base_url"], api_key="x", max_retries=0)
    if stream:
        with oai.responses.stream(model="m", input="why?") as s:
            answer = s.get_final_response()
    else:
        answer = oai.responses.create(model="m", input="why?")
    assert [o.type for o in answer.output] == ["reasoning", "message"]
    assert answer.output[0].summary[0].text == "add() subtracts"  # type: ignore[union-attr]
    assert answer.output_text == "fix add"
    claude = anthropic.Anthropic(base_url=session["anthropic_base_url"], api_key="x", max_retries=0)
    ask = {"model": "m", "max_tokens": 50, "messages": [{"role": "user", "content": "why?"}]}
    if stream:
        with claude.messages.stream(**ask) as s:  # type: ignore[arg-type]
            message = s.get_final_message()
    else:
        message = claude.messages.create(**ask)  # type: ignore[arg-type]
    assert [b.type for b in message.content] == ["thinking", "text"]
    assert message.content[0].thinking == "add() subtracts"  # type: ignore[union-attr]
    records = proxy.records(session["id"])
    assert all(
        r["completion_token_ids"] == tokens("<think>add() subtracts</think>fix add</s>")
        for r in records
    )
