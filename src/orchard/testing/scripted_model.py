"""A scripted OpenAI-compatible inference server on loopback, with token ids and logprobs.

A stand-in for vLLM (no GPU and no model here): real HTTP over a real socket, answers from a
script, and a real (if simple) tokenizer and chat template, so the token ids it returns stitch
across turns the way an engine's do. Each character is one token (its code point); the
template renders ``<role>content</s>`` per message and ends the prompt with ``<assistant>``; a
completion's tokens are its text plus ``</s>``. An assistant turn sent back in the history so
renders to exactly the tokens the model produced, so ``prompt + completion`` of one call is a
prefix of the next call's prompt, as with a real engine and an honest harness.

It answers like vLLM with ``return_token_ids``: top-level ``prompt_token_ids``, per-choice
``token_ids``, and ``logprobs.content`` when asked; streamed as SSE chunks too. A script entry
is a dict: ``content``, ``tool_calls`` (list of ``{"id", "name", "arguments"}``), ``status``
(an error answer), ``reasoning``; ``requests`` keeps every body received.

The script is a list of entries (answered in order) or a policy: a callable given each
request body (the Chat request the proxy forwards) that returns the entry to answer with, so
a test can drive a multi-step agent by what it sees (a tool's output, a file's contents).
Shared by the proxy's tests, the harness tests and the recipes' scripted runs.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

END = "</s>"


def render_message(message: dict[str, Any]) -> str:
    content = message.get("content") or ""
    if isinstance(content, list):
        content = "".join(str(p.get("text", "")) for p in content)
    if message.get("reasoning_content"):
        content = f"<think>{message['reasoning_content']}</think>{content}"
    calls = message.get("tool_calls")
    if calls:
        content += "".join(
            f"<call>{c['function']['name']}:{c['function']['arguments']}</call>" for c in calls
        )
    return f"<{message['role']}>{content}{END}"


def tokens(text: str) -> list[int]:
    return [ord(c) for c in text]


def prompt_ids(messages: list[dict[str, Any]]) -> list[int]:
    return tokens("".join(render_message(m) for m in messages) + "<assistant>")


def completion_text(entry: dict[str, Any]) -> str:
    text = entry.get("content") or ""
    if entry.get("reasoning"):
        text = f"<think>{entry['reasoning']}</think>{text}"
    for call in entry.get("tool_calls") or ():
        text += f"<call>{call['name']}:{call['arguments']}</call>"
    return text + END


def logprob_of(token: int) -> float:
    return -((token % 7) + 1) / 10.0


Policy = Callable[[dict[str, Any]], dict[str, Any]]


class ScriptedUpstream:
    def __init__(self, script: list[dict[str, Any]] | Policy) -> None:
        self.policy: Policy | None = script if callable(script) else None
        self.script: list[dict[str, Any]] = [] if callable(script) else list(script)
        self.requests: list[dict[str, Any]] = []
        self.lock = threading.Lock()
        self.delay_seconds = 0.0
        self.repeat_last = False

    def next_entry(self, body: dict[str, Any] | None = None) -> dict[str, Any]:
        if self.policy is not None:
            return self.policy(body or {})
        with self.lock:
            if not self.script:
                return {"status": 500, "content": "script exhausted"}
            if self.repeat_last and len(self.script) == 1:
                return self.script[0]
            return self.script.pop(0)

    def answer(self, body: dict[str, Any], entry: dict[str, Any]) -> dict[str, Any]:
        completion = tokens(completion_text(entry))
        message: dict[str, Any] = {"role": "assistant", "content": entry.get("content")}
        if entry.get("reasoning"):
            message["reasoning_content"] = entry["reasoning"]
        if entry.get("tool_calls"):
            message["tool_calls"] = [
                {"id": c["id"], "type": "function",
                 "function": {"name": c["name"], "arguments": c["arguments"]}}
                for c in entry["tool_calls"]
            ]  # fmt: skip
        choice: dict[str, Any] = {
            "index": 0, "message": message,
            "finish_reason": "tool_calls" if entry.get("tool_calls") else "stop",
        }  # fmt: skip
        prompt = prompt_ids(body["messages"])
        if body.get("return_token_ids"):
            choice["token_ids"] = completion
        if body.get("logprobs"):
            choice["logprobs"] = {"content": [
                {"token": f"token_id:{t}" if body.get("return_tokens_as_token_ids") else chr(t),
                 "logprob": logprob_of(t), "top_logprobs": []} for t in completion
            ]}  # fmt: skip
        answer: dict[str, Any] = {
            "id": "chatcmpl-scripted", "object": "chat.completion", "created": int(time.time()),
            "model": body.get("model", "scripted"), "choices": [choice],
            "usage": {"prompt_tokens": len(prompt), "completion_tokens": len(completion),
                      "total_tokens": len(prompt) + len(completion)},
        }  # fmt: skip
        if body.get("return_token_ids"):
            answer["prompt_token_ids"] = prompt
        return answer

    def chunks(self, body: dict[str, Any], entry: dict[str, Any]) -> Iterator[dict[str, Any]]:
        """The answer as vLLM streams it: role, content pieces, tool-call pieces, finish, usage."""
        full = self.answer(body, entry)
        choice = full["choices"][0]
        completion = tokens(completion_text(entry))
        head = {"id": full["id"], "object": "chat.completion.chunk", "created": full["created"],
                "model": full["model"]}  # fmt: skip
        first: dict[str, Any] = {
            **head,
            "choices": [
                {"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}
            ],
        }
        if body.get("return_token_ids"):
            first["prompt_token_ids"] = full["prompt_token_ids"]
        yield first
        content = entry.get("content") or ""
        pieces = [content[i : i + 4] for i in range(0, len(content), 4)]
        calls = entry.get("tool_calls") or []
        # token ids ride with the text they spell; tool-call and end tokens with the last pieces
        spent = 0
        events: list[tuple[dict[str, Any], int]] = []
        if entry.get("reasoning"):
            think = f"<think>{entry['reasoning']}</think>"
            events.append(({"reasoning_content": entry["reasoning"]}, len(think)))
        events += [({"content": p}, len(p)) for p in pieces]
        for i, call in enumerate(calls):
            text = f"<call>{call['name']}:{call['arguments']}</call>"
            events.append(({"tool_calls": [{"index": i, "id": call["id"], "type": "function",
                                            "function": {"name": call["name"], "arguments": ""}}]}, 0))  # fmt: skip
            events.append(({"tool_calls": [{"index": i, "function": {"arguments": call["arguments"]}}]},
                           len(text)))  # fmt: skip
        for delta, n in events:
            part: dict[str, Any] = {"index": 0, "delta": delta, "finish_reason": None}
            ids = completion[spent : spent + n]
            spent += n
            if body.get("return_token_ids"):
                part["token_ids"] = ids
            if body.get("logprobs"):
                part["logprobs"] = {"content": [
                    {"token": f"token_id:{t}", "logprob": logprob_of(t), "top_logprobs": []} for t in ids
                ]}  # fmt: skip
            yield {**head, "choices": [part]}
        last: dict[str, Any] = {"index": 0, "delta": {}, "finish_reason": choice["finish_reason"]}
        rest = completion[spent:]
        if body.get("return_token_ids"):
            last["token_ids"] = rest
        if body.get("logprobs"):
            last["logprobs"] = {"content": [
                {"token": f"token_id:{t}", "logprob": logprob_of(t), "top_logprobs": []} for t in rest
            ]}  # fmt: skip
        yield {**head, "choices": [last]}
        if (body.get("stream_options") or {}).get("include_usage"):
            yield {**head, "choices": [], "usage": full["usage"]}


def _handler(upstream: ScriptedUpstream) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:
            pass

        def _send(self, status: int, payload: dict[str, Any]) -> None:
            data = json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:
            self._send(200, {"object": "list", "data": [{"id": "scripted", "object": "model"}]})

        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            with upstream.lock:
                upstream.requests.append(body)
            entry = upstream.next_entry(body)
            if upstream.delay_seconds:
                time.sleep(upstream.delay_seconds)
            if entry.get("status"):
                self._send(entry["status"], {"error": {"message": entry.get("content", "scripted error"),
                                                       "type": "scripted"}})  # fmt: skip
                return
            if not body.get("stream"):
                self._send(200, upstream.answer(body, entry))
                return
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            for chunk in [*upstream.chunks(body, entry), "[DONE]"]:
                data = (
                    "data: " + (chunk if isinstance(chunk, str) else json.dumps(chunk)) + "\n\n"
                ).encode()
                self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
                self.wfile.flush()
            self.wfile.write(b"0\r\n\r\n")

    return Handler


@contextmanager
def scripted_upstream(
    script: list[dict[str, Any]] | Policy,
) -> Iterator[tuple[ScriptedUpstream, str]]:
    """The server and its base URL (``http://127.0.0.1:PORT/v1``)."""
    upstream = ScriptedUpstream(script)
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(upstream))
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield upstream, f"http://127.0.0.1:{server.server_address[1]}/v1"
    finally:
        server.shutdown()
        server.server_close()
