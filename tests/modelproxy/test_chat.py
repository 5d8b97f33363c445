"""OpenAI Chat through the proxy with the real ``openai`` client: answers as the upstream gave
them, tool calls, streaming, and the engine's token ids and logprobs recorded."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import openai
import pytest

from orchard.testing.scripted_model import (
    ScriptedUpstream,
    completion_text,
    logprob_of,
    prompt_ids,
    tokens,
)

from .conftest import Proxy, start_proxy, stop_proxy

TOOL = {"type": "function", "function": {"name": "run", "parameters": {
    "type": "object", "properties": {"cmd": {"type": "string"}}}}}  # fmt: skip


def test_chat_unstreamed_with_tool_call_is_answered_and_recorded(
    proxy: Proxy, upstream: tuple[ScriptedUpstream, str]
) -> None:
    server, _ = upstream
    entry = {
        "content": "let me look",
        "tool_calls": [{"id": "call_1", "name": "run", "arguments": '{"cmd":"ls"}'}],
    }
    server.script.append(entry)
    session = proxy.session(model_version="policy-7")
    client = openai.OpenAI(base_url=session["openai_base_url"], api_key="anything", max_retries=0)
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "fix it"}]
    answer = client.chat.completions.create(model="m", messages=messages, tools=[TOOL])  # type: ignore[arg-type]
    assert answer.choices[0].message.content == "let me look"
    call = answer.choices[0].message.tool_calls[0]  # type: ignore[index]
    assert (call.id, call.function.name, call.function.arguments) == (
        "call_1",
        "run",
        '{"cmd":"ls"}',
    )  # type: ignore[union-attr]
    assert answer.choices[0].logprobs is None  # the harness did not ask; the proxy did
    sent = server.requests[0]
    assert sent["logprobs"] is True and sent["return_token_ids"] is True
    [record] = proxy.records(session["id"])
    assert record["request"]["messages"] == messages
    assert record["prompt_token_ids"] == prompt_ids(messages)
    assert record["completion_token_ids"] == tokens(completion_text(entry))
    assert record["completion_logprobs"] == [logprob_of(t) for t in record["completion_token_ids"]]
    assert record["model_version"] == "policy-7" and record["retries"] == 0
    assert record["status"] == 200 and record["total_ms"] > 0


def test_chat_streamed_reaches_the_harness_and_is_reassembled(
    proxy: Proxy, upstream: tuple[ScriptedUpstream, str]
) -> None:
    server, _ = upstream
    entry = {
        "content": "patching the file now",
        "tool_calls": [{"id": "c9", "name": "run", "arguments": '{"cmd":"pytest"}'}],
    }
    server.script.append(entry)
    session = proxy.session()
    client = openai.OpenAI(base_url=session["openai_base_url"], api_key="x", max_retries=0)
    messages = [{"role": "user", "content": "go"}]
    stream = client.chat.completions.create(model="m", messages=messages, tools=[TOOL], stream=True)  # type: ignore[arg-type]
    text, args, finish, chunks = "", "", None, 0
    for chunk in stream:
        chunks += 1
        assert chunk.usage is None  # include_usage was the proxy's, not the harness's
        for choice in chunk.choices:
            text += choice.delta.content or ""
            for call in choice.delta.tool_calls or ():
                args += call.function.arguments or ""  # type: ignore[union-attr]
            finish = choice.finish_reason or finish
    assert (text, args, finish) == ("patching the file now", '{"cmd":"pytest"}', "tool_calls")
    assert chunks > 3
    [record] = proxy.records(session["id"])
    message = record["response"]["choices"][0]["message"]
    assert message["content"] == "patching the file now"
    assert message["tool_calls"][0]["function"] == {"name": "run", "arguments": '{"cmd":"pytest"}'}
    assert record["prompt_token_ids"] == prompt_ids(messages)
    assert record["completion_token_ids"] == tokens(completion_text(entry))
    assert len(record["completion_logprobs"]) == len(record["completion_token_ids"])
    assert record["stream"] is True and record["first_token_ms"] is not None


def test_harness_that_asks_for_logprobs_gets_them(
    proxy: Proxy, upstream: tuple[ScriptedUpstream, str]
) -> None:
    server, _ = upstream
    server.script.append({"content": "ok"})
    session = proxy.session()
    client = openai.OpenAI(base_url=session["openai_base_url"], api_key="x", max_retries=0)
    answer = client.chat.completions.create(
        model="m", messages=[{"role": "user", "content": "hi"}], logprobs=True
    )
    assert answer.choices[0].logprobs is not None
    assert len(answer.choices[0].logprobs.content or []) == len(tokens("ok</s>"))


def test_upstream_error_is_passed_on_and_recorded(
    proxy: Proxy, upstream: tuple[ScriptedUpstream, str]
) -> None:
    server, _ = upstream
    server.script.append({"status": 400, "content": "prompt too long"})
    session = proxy.session()
    client = openai.OpenAI(base_url=session["openai_base_url"], api_key="x", max_retries=0)
    try:
        client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
    except openai.BadRequestError as err:
        assert "prompt too long" in str(err)
    else:
        raise AssertionError("expected a 400")
    [record] = proxy.records(session["id"])
    assert record["status"] == 400 and "prompt too long" in json.dumps(record["error"])


def test_retry_of_the_same_body_is_one_record_marked_retried(
    proxy: Proxy, upstream: tuple[ScriptedUpstream, str]
) -> None:
    server, _ = upstream
    server.script += [{"status": 503, "content": "busy"}, {"content": "second try"}]
    session = proxy.session()
    client = openai.OpenAI(base_url=session["openai_base_url"], api_key="x", max_retries=2)
    answer = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
    assert answer.choices[0].message.content == "second try"
    [record] = proxy.records(session["id"])
    assert record["retries"] == 1 and record["status"] == 200
    assert record["response"]["choices"][0]["message"]["content"] == "second try"


def test_model_list_is_the_upstreams_and_needs_the_session(proxy: Proxy) -> None:
    session = proxy.session()
    client = openai.OpenAI(base_url=session["openai_base_url"], api_key="x", max_retries=0)
    assert [m.id for m in client.models.list()] == ["scripted"]
    status, answer = proxy.call("GET", "/s/ses_000000000000000000000000.x/v1/models", key=None)
    assert status == 401 and answer["error"]["code"] == "SESSION_INVALID"


def test_an_unreachable_upstream_is_a_502_and_is_recorded(tmp_path: Path, gateway: str) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{s.getsockname()[1]}/v1"
    proxy = start_proxy(tmp_path, dead, gateway)
    try:
        session = proxy.session()
        client = openai.OpenAI(base_url=session["openai_base_url"], api_key="x", max_retries=0)
        with pytest.raises(openai.InternalServerError) as err:
            client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
        assert err.value.status_code == 502 and "Cannot connect" in str(err.value)
        assert err.value.code == "UPSTREAM_UNREACHABLE"
        [record] = proxy.records(session["id"])
        assert record["status"] == 502 and record["error"]["code"] == "UPSTREAM_UNREACHABLE"
    finally:
        stop_proxy(proxy)
