"""A whole rollout through the proxy: a multi-step tool-using conversation (streamed and not),
the reward attached afterwards, samples exported token-exact against what the scripted engine
produced, and nothing lost when the proxy restarts."""

from __future__ import annotations

import json
from typing import Any

import openai

from orchard.testing.scripted_model import ScriptedUpstream, completion_text, prompt_ids, tokens

from .conftest import Proxy, start_proxy, stop_proxy

SCRIPT = [
    {"content": "", "tool_calls": [{"id": "c1", "name": "run", "arguments": '{"cmd":"pytest"}'}]},
    {
        "content": "the bug is in add",
        "tool_calls": [{"id": "c2", "name": "edit", "arguments": '{"f":"calc.py"}'}],
    },
    {"content": "fixed"},
]


def _rollout(proxy: Proxy, session: dict[str, Any]) -> list[dict[str, Any]]:
    client = openai.OpenAI(base_url=session["openai_base_url"], api_key="x", max_retries=0)
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "you fix bugs"},
        {"role": "user", "content": "tests fail"},
    ]
    for turn in range(3):
        stream = turn == 1
        if stream:
            content, calls = "", {}
            for chunk in client.chat.completions.create(model="m", messages=messages, stream=True):  # type: ignore[arg-type]
                delta = chunk.choices[0].delta if chunk.choices else None
                if delta is None:
                    continue
                content += delta.content or ""
                for c in delta.tool_calls or ():
                    slot = calls.setdefault(c.index, {"id": "", "name": "", "arguments": ""})
                    slot["id"] = c.id or slot["id"]
                    slot["name"] += (c.function.name or "") if c.function else ""
                    slot["arguments"] += (c.function.arguments or "") if c.function else ""
            tool_calls = [{"id": c["id"], "type": "function",
                           "function": {"name": c["name"], "arguments": c["arguments"]}} for c in calls.values()]  # fmt: skip
        else:
            answer = client.chat.completions.create(model="m", messages=messages)  # type: ignore[arg-type]
            content = answer.choices[0].message.content or ""
            tool_calls = [c.model_dump() for c in answer.choices[0].message.tool_calls or ()]
        reply: dict[str, Any] = {"role": "assistant", "content": content}
        if tool_calls:
            reply["tool_calls"] = tool_calls
        messages.append(reply)
        for call in tool_calls:
            messages.append({"role": "tool", "tool_call_id": call["id"], "content": "ok"})
    return messages


def _samples(proxy: Proxy, session_id: str) -> list[dict[str, Any]]:
    status, text = proxy.call("GET", f"/v1/sessions/{session_id}/samples")
    assert status == 200, text
    return [json.loads(line) for line in text.splitlines()]


def test_rollout_samples_are_token_exact_and_survive_a_restart(
    proxy: Proxy, upstream: tuple[ScriptedUpstream, str]
) -> None:
    server, url = upstream
    server.script += [dict(e) for e in SCRIPT]
    session = proxy.session(model_version="step-42", metadata={"task": "calc"})
    messages = _rollout(proxy, session)
    status, done = proxy.call(
        "POST", f"/v1/sessions/{session['id']}/finish", {"reward": 1.0, "fault": ""}
    )
    assert status == 200 and done["calls"] == 3
    [sample] = _samples(proxy, session["id"])
    # what the engine saw last, plus what it produced last: the whole sequence
    expected = prompt_ids(messages[:-1]) + tokens(completion_text(SCRIPT[2]))
    assert sample["tokens"] == expected and sample["token_exact"] is True
    model_text = "".join(
        chr(t) for t, m in zip(sample["tokens"], sample["loss_mask"], strict=True) if m
    )
    assert model_text == "".join(completion_text(e) for e in SCRIPT)
    assert sample["reward"] == 1.0 and sample["model_versions"] == ["step-42"]
    assert sample["calls"] == [0, 1, 2] and sample["trainable"] is True

    stop_proxy(proxy)
    again = start_proxy(proxy.home, url, proxy.args[proxy.args.index("--gateway") + 1])
    try:
        assert _samples(again, session["id"]) == [sample]
        assert len(again.records(session["id"])) == 3
        status, view = again.call("GET", f"/v1/sessions/{session['id']}")
        assert view["reward"] == 1.0 and view["metadata"] == {"task": "calc"}
    finally:
        stop_proxy(again)
