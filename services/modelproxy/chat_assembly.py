"""What an OpenAI Chat answer carries for training, and a streamed answer put back together.

``ChatAssembler`` folds ``chat.completion.chunk`` events into the ``chat.completion`` the same
call would have answered unstreamed (content, reasoning, tool calls by index, finish reason,
usage, and the engine's token ids and logprobs), so a record looks the same whichever way the
harness asked. ``token_fields`` reads token ids and logprobs from the shapes engines use:
vLLM's ``prompt_token_ids`` / choice ``token_ids`` (``return_token_ids``), logprob tokens of the
form ``token_id:N`` (``return_tokens_as_token_ids``), and ``output_token_ids`` where a server
names them so.
"""

from __future__ import annotations

from typing import Any

TOKEN_ID_PREFIX = "token_id:"


class ChatAssembler:
    def __init__(self) -> None:
        self.head: dict[str, Any] = {}
        self.choices: dict[int, dict[str, Any]] = {}
        self.usage: Any = None
        self.prompt_token_ids: list[int] | None = None

    def add(self, chunk: dict[str, Any]) -> None:
        if not self.head:
            self.head = {k: chunk.get(k) for k in ("id", "created", "model", "system_fingerprint")}
        if chunk.get("usage"):
            self.usage = chunk["usage"]
        if isinstance(chunk.get("prompt_token_ids"), list):
            self.prompt_token_ids = chunk["prompt_token_ids"]
        for part in chunk.get("choices") or ():
            choice = self.choices.setdefault(
                int(part.get("index", 0)),
                {"message": {"role": "assistant", "content": None}, "finish_reason": None},
            )
            delta = part.get("delta") or {}
            message = choice["message"]
            for key in ("content", "reasoning_content", "reasoning", "refusal"):
                if delta.get(key):
                    message[key] = (message.get(key) or "") + delta[key]
            for call in delta.get("tool_calls") or ():
                calls = message.setdefault("tool_calls", [])
                at = int(call.get("index", len(calls)))
                while len(calls) <= at:
                    calls.append(
                        {"id": "", "type": "function", "function": {"name": "", "arguments": ""}}
                    )
                slot = calls[at]
                slot["id"] = call.get("id") or slot["id"]
                function = call.get("function") or {}
                slot["function"]["name"] += function.get("name") or ""
                slot["function"]["arguments"] += function.get("arguments") or ""
            if part.get("finish_reason"):
                choice["finish_reason"] = part["finish_reason"]
            if isinstance(part.get("token_ids"), list):
                choice.setdefault("token_ids", []).extend(part["token_ids"])
            content = (part.get("logprobs") or {}).get("content")
            if content:
                choice.setdefault("logprobs", {"content": []})["content"].extend(content)

    def completion(self) -> dict[str, Any]:
        answer: dict[str, Any] = {**self.head, "object": "chat.completion"}
        answer["choices"] = [{"index": i, **c} for i, c in sorted(self.choices.items())]
        if self.usage is not None:
            answer["usage"] = self.usage
        if self.prompt_token_ids is not None:
            answer["prompt_token_ids"] = self.prompt_token_ids
        return answer


def token_fields(
    answer: dict[str, Any],
) -> tuple[list[int] | None, list[int] | None, list[float] | None]:
    """(prompt token ids, first choice's completion token ids, their logprobs), None where the
    upstream did not give them."""
    prompt = answer.get("prompt_token_ids")
    choices = answer.get("choices") or [{}]
    choice = choices[0]
    prompt = prompt if prompt is not None else choice.get("prompt_token_ids")
    completion = choice.get("token_ids")
    if completion is None:
        completion = choice.get("output_token_ids")
    content = (choice.get("logprobs") or {}).get("content") or None
    logprobs = [float(c.get("logprob", 0.0)) for c in content] if content else None
    if completion is None and content:
        tokens = [str(c.get("token", "")) for c in content]
        if all(t.startswith(TOKEN_ID_PREFIX) for t in tokens):
            completion = [int(t[len(TOKEN_ID_PREFIX) :]) for t in tokens]
    if logprobs is not None and completion is not None and len(logprobs) != len(completion):
        logprobs = None  # not one per token: unusable for training, not guessed at
    return (
        [int(t) for t in prompt] if isinstance(prompt, list) else None,
        [int(t) for t in completion] if isinstance(completion, list) else None,
        logprobs,
    )


def strip_injected(answer: dict[str, Any], keep_logprobs: bool) -> dict[str, Any]:
    """``answer`` (a completion or a chunk) without what the proxy asked for on its own behalf,
    so the harness sees the answer it asked for."""
    answer.pop("prompt_token_ids", None)
    answer.pop("prompt_logprobs", None)
    for choice in answer.get("choices") or ():
        choice.pop("token_ids", None)
        choice.pop("prompt_token_ids", None)
        if not keep_logprobs:
            choice.pop("logprobs", None)
    return answer
