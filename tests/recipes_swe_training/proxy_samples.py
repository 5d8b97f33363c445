"""Training samples as the recording proxy makes them: the real proxy process between a
scripted upstream (orchard.testing.scripted_model: code-point tokens, logprobs) and a small
tool-calling loop over HTTP, the session finished with the rollout's reward."""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from orchard.testing.scripted_model import scripted_upstream
from tests.modelproxy.conftest import Proxy, start_proxy, stop_proxy

from .services import API_KEY, key_gateway


@dataclass(frozen=True)
class Turn:
    """One agent step: a bash tool call, and what the tool answered."""

    command: str
    output: str


def _post(url: str, body: dict[str, Any]) -> dict[str, Any]:
    request = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST")
    request.add_header("Content-Type", "application/json")
    with urllib.request.urlopen(request, timeout=30) as response:
        return dict(json.loads(response.read()))


def _policy(turns: Sequence[Turn]):  # type: ignore[no-untyped-def]
    def answer(body: dict[str, Any]) -> dict[str, Any]:
        done = sum(1 for m in body["messages"] if m["role"] == "assistant")
        if done < len(turns):
            args = json.dumps({"command": turns[done].command})
            return {"content": f"step {done + 1}", "tool_calls": [
                {"id": f"call_{done}", "name": "bash", "arguments": args}]}  # fmt: skip
        return {"content": "I am done."}

    return answer


def run_session(
    proxy: Proxy, task: str, turns: Sequence[Turn], reward: float
) -> list[dict[str, Any]]:
    """One rollout through the proxy (len(turns) tool calls, then a final answer): its samples."""
    session = proxy.session(key=API_KEY, metadata={"task": task})
    url = session["openai_base_url"] + "/chat/completions"
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You fix bugs with bash."},
        {"role": "user", "content": task},
    ]
    tools = [{"type": "function", "function": {"name": "bash", "parameters": {"type": "object"}}}]
    for turn in [*turns, None]:
        reply = _post(url, {"model": "student", "messages": messages, "tools": tools})
        message = reply["choices"][0]["message"]
        messages.append(
            {k: v for k, v in message.items() if k in ("role", "content", "tool_calls")}
        )
        if turn is None:
            break
        messages.append({"role": "tool", "tool_call_id": message["tool_calls"][0]["id"],
                         "content": turn.output})  # fmt: skip
    status, _ = proxy.call("POST", f"/v1/sessions/{session['id']}/finish",
                           {"reward": reward, "fault": ""}, key=API_KEY)  # fmt: skip
    assert status == 200
    status, text = proxy.call("GET", f"/v1/sessions/{session['id']}/samples", key=API_KEY)
    assert status == 200, text
    return [json.loads(line) for line in text.splitlines() if line]


@contextmanager
def recording_proxy(home: Path, turns_by_task: dict[str, Sequence[Turn]]) -> Iterator[Proxy]:
    """A proxy whose scripted upstream plays each task's turns (chosen by the user message)."""
    policies = {task: _policy(turns) for task, turns in turns_by_task.items()}

    def policy(body: dict[str, Any]) -> dict[str, Any]:
        task = next(m["content"] for m in body["messages"] if m["role"] == "user")
        return policies[task](body)  # type: ignore[no-any-return]

    with key_gateway({API_KEY}) as gateway, scripted_upstream(policy) as (_, url):
        proxy = start_proxy(home, url, gateway)
        try:
            yield proxy
        finally:
            stop_proxy(proxy)
