"""OpenAI Chat Completions as the harness speaks it: the identity translation onto Chat.

Every front (Chat, Responses, Messages) is a *translation* with the same four parts, so one
handler (``calls.ModelCall``) records them all alike:

- ``to_chat(request)``: the Chat body for the upstream (a ProxyError naming any field that
  cannot be carried);
- ``from_chat(completion)``: the harness's answer from the upstream's Chat completion;
- ``stream()``: an object turning Chat chunks into the harness's SSE bytes (``feed``) and
  closing the stream (``close``, given the reassembled completion);
- ``error_body(status, upstream_error)``: an upstream error in the harness's format.
"""

from __future__ import annotations

import json
from typing import Any

from .chat_assembly import strip_injected
from .errors import bad_request, unsupported


def sse(data: Any, event: str | None = None) -> bytes:
    head = f"event: {event}\n" if event else ""
    return f"{head}data: {json.dumps(data, separators=(',', ':'))}\n\n".encode()


class ChatTranslation:
    api = "chat"

    def __init__(self, request: dict[str, Any]) -> None:
        self.request = request
        self._keep_logprobs = bool(request.get("logprobs"))
        self._wants_usage = bool((request.get("stream_options") or {}).get("include_usage"))

    def to_chat(self) -> dict[str, Any]:
        if not isinstance(self.request.get("messages"), list) or not self.request["messages"]:
            raise bad_request("messages: expected a non-empty list")
        if self.request.get("n", 1) != 1:
            raise unsupported(
                "n", "the recording proxy records one completion per call; send n calls"
            )
        return self.request

    def from_chat(self, completion: dict[str, Any]) -> dict[str, Any]:
        return strip_injected(completion, self._keep_logprobs)

    def feed(self, chunk: dict[str, Any]) -> bytes:
        if not chunk.get("choices") and chunk.get("usage") and not self._wants_usage:
            return b""  # the usage chunk the proxy asked for, not the harness
        if not self._wants_usage:
            chunk.pop("usage", None)
        return sse(strip_injected(chunk, self._keep_logprobs))

    def close(self, completion: dict[str, Any]) -> bytes:
        return b"data: [DONE]\n\n"

    def error_body(self, status: int, error: dict[str, Any]) -> dict[str, Any]:
        return error if "error" in error else {"error": {"message": json.dumps(error)[:2000]}}
