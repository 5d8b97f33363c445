"""Anthropic Messages (``/v1/messages``, what Claude Code speaks) translated onto Chat.

Carried faithfully: ``system`` (text or text blocks) -> a system message; text blocks; base64
and URL images -> ``image_url`` parts; ``tool_use`` blocks -> the assistant's ``tool_calls``
(``input`` as JSON arguments); ``tool_result`` blocks -> ``tool`` messages (in their order,
before the user's other content; ``is_error: true`` is carried as an ``Error: `` prefix of the
tool content, Chat having no error flag); ``thinking`` blocks of the history -> the assistant's
``reasoning_content``; ``tools`` (``input_schema`` -> ``parameters``); ``tool_choice``
(auto/any/tool/none, ``disable_parallel_tool_use``); ``max_tokens``, ``temperature``,
``top_p``, ``top_k``, ``stop_sequences``, ``metadata.user_id``, ``stream``.

Refused with 400 naming the field (cannot be carried): ``redacted_thinking`` blocks, documents,
server tools (a tool with a ``type`` such as ``web_search_*``), the ``thinking`` setting,
``container``, ``mcp_servers``, and any unknown block or field. Dropped and listed in the
record's ``not_carried`` (hints with no effect on what the model is asked): ``cache_control``,
``service_tier``, ``output_config`` (Claude Code's effort hint), ``context_management``
(server-side context editing: the upstream gets the whole context as sent).

The answer: text -> a ``text`` block, reasoning -> a ``thinking`` block (no signature: none is
made up), tool calls -> ``tool_use`` blocks (arguments that are not a JSON object are a 502:
Messages cannot carry them), ``finish_reason`` -> ``stop_reason``.
"""

from __future__ import annotations

import json
import secrets
from typing import Any

from .chat_api import sse
from .errors import ProxyError, bad_request, hints_dropped, unsupported
from .stream_blocks import BlockStream

_FIELDS = {"model", "messages", "system", "max_tokens", "temperature", "top_p", "top_k",
           "stop_sequences", "stream", "tools", "tool_choice", "metadata"}  # fmt: skip
_HINTS = {"cache_control", "service_tier", "output_config", "context_management"}
_STOP = {
    "stop": "end_turn",
    "tool_calls": "tool_use",
    "length": "max_tokens",
    "content_filter": "refusal",
}


def _blocks(content: Any, where: str) -> list[dict[str, Any]]:
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    if not isinstance(content, list):
        raise bad_request(f"{where}: expected a string or a list of blocks")
    for i, block in enumerate(content):
        if not isinstance(block, dict) or not isinstance(block.get("type"), str):
            raise bad_request(f"{where}[{i}]: expected a block object with a type")
    return content


def _image(block: dict[str, Any], where: str) -> dict[str, Any]:
    source = block.get("source") or {}
    if source.get("type") == "base64":
        url = f"data:{source.get('media_type')};base64,{source.get('data')}"
    elif source.get("type") == "url":
        url = str(source.get("url"))
    else:
        raise unsupported(
            f"{where}.source.type", f"{source.get('type')!r} images cannot be carried"
        )
    return {"type": "image_url", "image_url": {"url": url}}


class MessagesTranslation:
    api = "messages"

    def __init__(self, request: dict[str, Any]) -> None:
        self.request = request
        self.not_carried: list[str] = []
        self.blocks = BlockStream()
        self.id = "msg_" + secrets.token_hex(12)
        self._started = False
        self._index = -1

    def _note(self, where: str, block: dict[str, Any]) -> None:
        for hint in _HINTS & set(block):
            self.not_carried.append(f"{where}.{hint}")

    def _user(self, content: Any, where: str) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        parts: list[dict[str, Any]] = []
        for i, block in enumerate(_blocks(content, where)):
            at = f"{where}[{i}]"
            self._note(at, block)
            kind = block["type"]
            if kind == "text":
                parts.append({"type": "text", "text": str(block.get("text", ""))})
            elif kind == "image":
                parts.append(_image(block, at))
            elif kind == "tool_result":
                result = block.get("content", "")
                if isinstance(result, list):
                    texts = []
                    for j, part in enumerate(result):
                        if not isinstance(part, dict) or part.get("type") != "text":
                            raise unsupported(
                                f"{at}.content[{j}]", "only text tool results can be carried"
                            )
                        texts.append(str(part.get("text", "")))
                    result = "".join(texts)
                text = ("Error: " if block.get("is_error") else "") + str(result)
                out.append(
                    {
                        "role": "tool",
                        "tool_call_id": str(block.get("tool_use_id", "")),
                        "content": text,
                    }
                )
            else:
                raise unsupported(f"{at}.type", f"{kind!r} blocks cannot be carried onto Chat")
        if parts:
            only_text = all(p["type"] == "text" for p in parts)
            content_out: Any = "".join(p["text"] for p in parts) if only_text else parts
            out.append({"role": "user", "content": content_out})
        return out

    def _assistant(self, content: Any, where: str) -> dict[str, Any]:
        message: dict[str, Any] = {"role": "assistant", "content": ""}
        for i, block in enumerate(_blocks(content, where)):
            at = f"{where}[{i}]"
            self._note(at, block)
            kind = block["type"]
            if kind == "text":
                message["content"] += str(block.get("text", ""))
            elif kind == "tool_use":
                message.setdefault("tool_calls", []).append({
                    "id": str(block.get("id", "")), "type": "function",
                    "function": {"name": str(block.get("name", "")),
                                 "arguments": json.dumps(block.get("input", {}))},
                })  # fmt: skip
            elif kind == "thinking":
                message["reasoning_content"] = message.get("reasoning_content", "") + str(
                    block.get("thinking", "")
                )
            else:
                raise unsupported(f"{at}.type", f"{kind!r} blocks cannot be carried onto Chat")
        if not message["content"] and message.get("tool_calls"):
            message["content"] = None
        return message

    def to_chat(self) -> dict[str, Any]:
        r = self.request
        self.not_carried += hints_dropped(r, _FIELDS, _HINTS, "Messages")
        if not isinstance(r.get("messages"), list) or not r["messages"]:
            raise bad_request("messages: expected a non-empty list")
        if not isinstance(r.get("max_tokens"), int):
            raise bad_request("max_tokens: required, an integer")
        messages: list[dict[str, Any]] = []
        if r.get("system"):
            system = r["system"]
            if isinstance(system, list):
                for i, block in enumerate(system):
                    if not isinstance(block, dict) or block.get("type") != "text":
                        raise unsupported(f"system[{i}]", "only text system blocks can be carried")
                    self._note(f"system[{i}]", block)
                system = "".join(str(b.get("text", "")) for b in system)
            messages.append({"role": "system", "content": str(system)})
        for i, message in enumerate(r["messages"]):
            if not isinstance(message, dict):
                raise bad_request(f"messages[{i}]: expected an object")
            role = message.get("role")
            if role == "user":
                messages += self._user(message.get("content"), f"messages[{i}].content")
            elif role == "assistant":
                messages.append(self._assistant(message.get("content"), f"messages[{i}].content"))
            else:
                raise bad_request(f"messages[{i}].role: expected 'user' or 'assistant'")
        chat: dict[str, Any] = {
            "model": r.get("model", ""),
            "messages": messages,
            "max_tokens": r["max_tokens"],
        }
        for key in ("temperature", "top_p", "top_k", "stream"):
            if key in r:
                chat[key] = r[key]
        if r.get("stop_sequences"):
            chat["stop"] = r["stop_sequences"]
        if (r.get("metadata") or {}).get("user_id"):
            chat["user"] = str(r["metadata"]["user_id"])
        if r.get("tools"):
            chat["tools"] = []
            for i, tool in enumerate(r["tools"]):
                if not isinstance(tool, dict) or tool.get("type") not in (None, "custom"):
                    raise unsupported(
                        f"tools[{i}].type", "server tools cannot be carried onto Chat"
                    )
                self._note(f"tools[{i}]", tool)
                chat["tools"].append({"type": "function", "function": {
                    "name": tool.get("name"), "description": tool.get("description", ""),
                    "parameters": tool.get("input_schema") or {"type": "object"}}})  # fmt: skip
        choice = r.get("tool_choice")
        if choice:
            kind = choice.get("type")
            mapped = {"auto": "auto", "any": "required", "none": "none"}.get(kind)
            if kind == "tool":
                chat["tool_choice"] = {"type": "function", "function": {"name": choice.get("name")}}
            elif mapped:
                chat["tool_choice"] = mapped
            else:
                raise unsupported("tool_choice.type", f"{kind!r}")
            if choice.get("disable_parallel_tool_use"):
                chat["parallel_tool_calls"] = False
        return chat

    def _usage(self, completion: dict[str, Any]) -> dict[str, int]:
        usage = completion.get("usage") or {}
        return {"input_tokens": int(usage.get("prompt_tokens", 0)),
                "output_tokens": int(usage.get("completion_tokens", 0))}  # fmt: skip

    def from_chat(self, completion: dict[str, Any]) -> dict[str, Any]:
        choice = (completion.get("choices") or [{}])[0]
        message = choice.get("message") or {}
        content: list[dict[str, Any]] = []
        reasoning = message.get("reasoning_content") or message.get("reasoning")
        if reasoning:
            content.append({"type": "thinking", "thinking": reasoning, "signature": ""})
        if message.get("content"):
            content.append({"type": "text", "text": message["content"]})
        for call in message.get("tool_calls") or ():
            function = call.get("function") or {}
            content.append({"type": "tool_use", "id": call.get("id"), "name": function.get("name"),
                            "input": _arguments(function.get("arguments"))})  # fmt: skip
        return {
            "id": self.id, "type": "message", "role": "assistant",
            "model": completion.get("model") or self.request.get("model"), "content": content,
            "stop_reason": _STOP.get(choice.get("finish_reason") or "stop", "end_turn"),
            "stop_sequence": None, "usage": self._usage(completion),
        }  # fmt: skip

    def feed(self, chunk: dict[str, Any]) -> bytes:
        out = b""
        if not self._started:
            self._started = True
            out += sse({"type": "message_start", "message": {
                "id": self.id, "type": "message", "role": "assistant", "content": [],
                "model": chunk.get("model") or self.request.get("model"), "stop_reason": None,
                "stop_sequence": None, "usage": {"input_tokens": 0, "output_tokens": 0}}}, "message_start")  # fmt: skip
        return out + self._render(self.blocks.feed(chunk))

    def _render(self, events: list[tuple[str, str, Any]]) -> bytes:
        out = b""
        for step, kind, info in events:
            if step == "open":
                self._index += 1
                block: dict[str, Any] = {"type": "text", "text": ""}
                if kind == "reasoning":
                    block = {"type": "thinking", "thinking": "", "signature": ""}
                elif kind == "tool":
                    block = {
                        "type": "tool_use",
                        "id": info["id"],
                        "name": info["name"],
                        "input": {},
                    }
                out += sse({"type": "content_block_start", "index": self._index, "content_block": block},
                           "content_block_start")  # fmt: skip
            elif step == "delta":
                delta = {"text": {"type": "text_delta", "text": info},
                         "reasoning": {"type": "thinking_delta", "thinking": info},
                         "tool": {"type": "input_json_delta", "partial_json": info}}[kind]  # fmt: skip
                out += sse({"type": "content_block_delta", "index": self._index, "delta": delta},
                           "content_block_delta")  # fmt: skip
            else:
                out += sse(
                    {"type": "content_block_stop", "index": self._index}, "content_block_stop"
                )
        return out

    def close(self, completion: dict[str, Any]) -> bytes:
        out = self._render(self.blocks.finish())
        choice = (completion.get("choices") or [{}])[0]
        out += sse({"type": "message_delta", "delta": {
            "stop_reason": _STOP.get(choice.get("finish_reason") or "stop", "end_turn"),
            "stop_sequence": None}, "usage": self._usage(completion)}, "message_delta")  # fmt: skip
        return out + sse({"type": "message_stop"}, "message_stop")

    def error_body(self, status: int, error: dict[str, Any]) -> dict[str, Any]:
        message = (
            (error.get("error") or {}).get("message")
            if isinstance(error.get("error"), dict)
            else None
        )
        return {
            "type": "error",
            "error": {"type": "api_error", "message": message or json.dumps(error)[:2000]},
        }


def _arguments(raw: Any) -> dict[str, Any]:
    try:
        value = json.loads(raw or "{}")
    except ValueError:
        value = None
    if not isinstance(value, dict):
        raise ProxyError(502, "UPSTREAM_BAD_TOOL_CALL",
                         f"the model's tool-call arguments are not a JSON object: {str(raw)[:200]!r}")  # fmt: skip
    return value
