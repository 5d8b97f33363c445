"""OpenAI Responses (``/v1/responses``, the only API Codex speaks) translated onto Chat.

Carried faithfully: ``instructions`` -> a system message; ``input`` as a string or items:
``message`` items (roles user / assistant / system; ``developer`` becomes ``system``, Chat
engines' templates knowing no developer role) with ``input_text`` / ``output_text`` /
``input_image`` parts; ``function_call`` items -> the assistant's ``tool_calls`` (consecutive
calls join one assistant message, as the model emitted them); ``function_call_output`` ->
``tool`` messages; ``reasoning`` items' summary text -> the next assistant message's
``reasoning_content``; ``tools`` of type ``function``, and of type ``namespace`` (Codex's MCP
servers): each inner function becomes a Chat function named ``<namespace>__<name>``, the
model's call of it comes back as a ``function_call`` with ``name`` and ``namespace``, and a
call sent back in the input is flattened the same way (``tool_names`` has the rules and the
limits; the record keeps the table as ``tool_names``); ``tool_choice``;
``parallel_tool_calls``; ``max_output_tokens`` -> ``max_tokens``; ``temperature``, ``top_p``,
``reasoning.effort`` -> ``reasoning_effort``; ``stream``.

Refused with 400 naming the field: namespaced tools that cannot be flattened one-to-one onto
Chat's function names (``tool_names``), tools of any other type (``web_search``,
``file_search``, ``computer_use``, ``custom``, ``local_shell``, ...), ``previous_response_id``
and ``conversation`` (the proxy keeps no server-side state: send the whole input),
``background``, item types other than the above, ``input_file`` parts, encrypted reasoning
content, and any unknown field. Dropped and listed in the record's ``not_carried``: ``store``,
``include``, ``prompt_cache_key``, ``service_tier``, ``safety_identifier``, ``user``,
``metadata``, ``truncation``, ``text`` (verbosity/format hints), ``reasoning.summary``,
``client_metadata`` (Codex's installation and session ids), a namespace's ``description`` and
an inner tool's ``output_schema``.

The answer: reasoning -> a ``reasoning`` item (summary text), text -> a ``message`` item with
one ``output_text`` part, tool calls -> ``function_call`` items (with ``namespace`` for a
flattened tool); streamed as the Responses event sequence (``response.created`` ...
``response.completed``).
"""

from __future__ import annotations

import secrets
import time
from typing import Any

from .chat_api import sse
from .errors import bad_request, hints_dropped, unsupported
from .stream_blocks import BlockStream
from .tool_names import ToolNames, chat_function

_FIELDS = {"model", "input", "instructions", "tools", "tool_choice", "parallel_tool_calls",
           "max_output_tokens", "temperature", "top_p", "stream", "reasoning"}  # fmt: skip
_HINTS = {"store", "include", "prompt_cache_key", "service_tier", "safety_identifier", "user",
          "metadata", "truncation", "text", "stream_options", "client_metadata"}  # fmt: skip


def _id(prefix: str) -> str:
    return f"{prefix}_{secrets.token_hex(12)}"


class ResponsesTranslation:
    api = "responses"

    def __init__(self, request: dict[str, Any]) -> None:
        self.request = request
        self.not_carried: list[str] = []
        self.blocks = BlockStream()
        self.names = ToolNames()
        """The request's namespaced tools by their flattened Chat names (``tool_names``)."""
        self.id = _id("resp")
        self.created = int(time.time())
        self._seq = 0
        self._items: list[dict[str, Any]] = []
        self._started = False

    # ---- request --------------------------------------------------------------------

    def _parts(self, content: Any, where: str) -> Any:
        if isinstance(content, str):
            return content
        if not isinstance(content, list):
            raise bad_request(f"{where}: expected a string or a list of parts")
        parts: list[dict[str, Any]] = []
        for i, part in enumerate(content):
            kind = part.get("type") if isinstance(part, dict) else None
            if kind in ("input_text", "output_text", "text"):
                parts.append({"type": "text", "text": str(part.get("text", ""))})
            elif kind == "input_image" and part.get("image_url"):
                parts.append({"type": "image_url", "image_url": {"url": str(part["image_url"])}})
            else:
                raise unsupported(
                    f"{where}[{i}].type", f"{kind!r} parts cannot be carried onto Chat"
                )
        if all(p["type"] == "text" for p in parts):
            return "".join(p["text"] for p in parts)
        return parts

    def _messages(self, items: Any) -> list[dict[str, Any]]:
        if isinstance(items, str):
            return [{"role": "user", "content": items}]
        if not isinstance(items, list):
            raise bad_request("input: expected a string or a list of items")
        out: list[dict[str, Any]] = []
        reasoning = ""
        for i, item in enumerate(items):
            where = f"input[{i}]"
            if not isinstance(item, dict):
                raise bad_request(f"{where}: expected an object")
            kind = item.get("type", "message")
            if kind == "message":
                role = {"developer": "system"}.get(item.get("role", ""), item.get("role"))
                if role not in ("user", "assistant", "system"):
                    raise bad_request(f"{where}.role: {item.get('role')!r}")
                message: dict[str, Any] = {
                    "role": role,
                    "content": self._parts(item.get("content"), f"{where}.content"),
                }
                if role == "assistant" and reasoning:
                    message["reasoning_content"], reasoning = reasoning, ""
                out.append(message)
            elif kind == "function_call":
                last = out[-1] if out else None
                name = self.names.history_name(item, where)
                call = {"id": str(item.get("call_id", "")), "type": "function",
                        "function": {"name": name, "arguments": str(item.get("arguments", ""))}}  # fmt: skip
                if (
                    last is not None and last["role"] == "assistant"
                ):  # the same model turn: its text and its calls are one Chat message
                    last.setdefault("tool_calls", []).append(call)
                    if not last.get("content"):
                        last["content"] = None
                else:
                    message = {"role": "assistant", "content": None, "tool_calls": [call]}
                    if reasoning:
                        message["reasoning_content"], reasoning = reasoning, ""
                    out.append(message)
            elif kind == "function_call_output":
                output = item.get("output", "")
                if not isinstance(output, str):
                    output = self._parts(output, f"{where}.output")
                    if not isinstance(output, str):
                        raise unsupported(
                            f"{where}.output", "only text tool outputs can be carried"
                        )
                out.append(
                    {
                        "role": "tool",
                        "tool_call_id": str(item.get("call_id", "")),
                        "content": output,
                    }
                )
            elif kind == "reasoning":
                if item.get("encrypted_content"):
                    raise unsupported(
                        f"{where}.encrypted_content", "encrypted reasoning cannot be carried"
                    )
                reasoning += "".join(
                    str(s.get("text", "")) for s in item.get("summary") or () if isinstance(s, dict)
                )
                reasoning += "".join(
                    str(s.get("text", "")) for s in item.get("content") or () if isinstance(s, dict)
                )
            else:
                raise unsupported(f"{where}.type", f"{kind!r} items cannot be carried onto Chat")
        return out

    def _tools(self, tools: Any) -> list[dict[str, Any]]:
        if not isinstance(tools, list):
            raise bad_request("tools: expected a list of tools")
        out: list[dict[str, Any]] = []
        for i, tool in enumerate(tools):
            kind = tool.get("type") if isinstance(tool, dict) else None
            if kind == "namespace":
                out += self.names.flatten(tool, f"tools[{i}]", self.not_carried)
            elif kind == "function":
                self.names.function(tool.get("name"), f"tools[{i}]")
                out.append({"type": "function", "function": chat_function(tool)})
            else:
                raise unsupported(f"tools[{i}].type", f"{kind!r} tools cannot be carried onto Chat")
        return out

    @property
    def tool_names(self) -> dict[str, dict[str, str]]:
        """What the record keeps of the flattening: Chat name -> namespace and name."""
        return {
            flat: {"namespace": ns, "name": name} for flat, (ns, name) in self.names.chat.items()
        }

    def to_chat(self) -> dict[str, Any]:
        r = self.request
        self.not_carried += hints_dropped(r, _FIELDS, _HINTS, "Responses")
        tools = self._tools(r["tools"]) if r.get("tools") else []  # first: the history's names
        messages = []
        if r.get("instructions"):
            messages.append({"role": "system", "content": str(r["instructions"])})
        messages += self._messages(r.get("input"))
        if not messages:
            raise bad_request("input: empty")
        chat: dict[str, Any] = {"model": r.get("model", ""), "messages": messages}
        for key in ("temperature", "top_p", "stream", "parallel_tool_calls"):
            if key in r:
                chat[key] = r[key]
        if r.get("max_output_tokens"):
            chat["max_tokens"] = r["max_output_tokens"]
        reasoning = r.get("reasoning") or {}
        if reasoning.get("effort"):
            chat["reasoning_effort"] = reasoning["effort"]
        if reasoning.get("summary"):
            self.not_carried.append("reasoning.summary")
        if tools:
            chat["tools"] = tools
        choice = r.get("tool_choice")
        if isinstance(choice, str):
            chat["tool_choice"] = choice
        elif isinstance(choice, dict):
            if choice.get("type") != "function":
                raise unsupported("tool_choice.type", f"{choice.get('type')!r}")
            name = self.names.history_name(choice, "tool_choice")
            chat["tool_choice"] = {"type": "function", "function": {"name": name}}
        return chat

    # ---- answer ---------------------------------------------------------------------

    def _response(
        self, status: str, output: list[dict[str, Any]], completion: dict[str, Any] | None
    ) -> dict[str, Any]:
        usage = (completion or {}).get("usage") or {}
        finish = ((completion or {}).get("choices") or [{}])[0].get("finish_reason")
        incomplete = status == "completed" and finish == "length"
        return {
            "id": self.id, "object": "response", "created_at": self.created,
            "status": "incomplete" if incomplete else status,
            "incomplete_details": {"reason": "max_output_tokens"} if incomplete else None,
            "model": (completion or {}).get("model") or self.request.get("model"),
            "output": output, "error": None,
            "instructions": self.request.get("instructions"),
            "tools": self.request.get("tools", []), "tool_choice": self.request.get("tool_choice", "auto"),
            "parallel_tool_calls": self.request.get("parallel_tool_calls", True),
            "temperature": self.request.get("temperature"), "top_p": self.request.get("top_p"),
            "usage": {
                "input_tokens": int(usage.get("prompt_tokens", 0)),
                "input_tokens_details": {"cached_tokens": 0},
                "output_tokens": int(usage.get("completion_tokens", 0)),
                "output_tokens_details": {"reasoning_tokens": 0},
                "total_tokens": int(usage.get("total_tokens", 0)),
            } if completion else None,
        }  # fmt: skip

    def from_chat(self, completion: dict[str, Any]) -> dict[str, Any]:
        message = ((completion.get("choices") or [{}])[0]).get("message") or {}
        output: list[dict[str, Any]] = []
        reasoning = message.get("reasoning_content") or message.get("reasoning")
        if reasoning:
            output.append(_reasoning_item(_id("rs"), reasoning))
        if message.get("content"):
            output.append(_message_item(_id("msg"), message["content"], "completed"))
        for call in message.get("tool_calls") or ():
            function = call.get("function") or {}
            output.append(_call_item(_id("fc"), call.get("id"), self.names.responses_call(function.get("name")),
                                     function.get("arguments") or "", "completed"))  # fmt: skip
        return self._response("completed", output, completion)

    def _event(self, kind: str, **fields: Any) -> bytes:
        self._seq += 1
        return sse({"type": kind, "sequence_number": self._seq, **fields}, kind)

    def feed(self, chunk: dict[str, Any]) -> bytes:
        out = b""
        if not self._started:
            self._started = True
            head = self._response("in_progress", [], None)
            out += self._event("response.created", response=head)
            out += self._event("response.in_progress", response=head)
        return out + self._render(self.blocks.feed(chunk))

    def _render(self, events: list[tuple[str, str, Any]]) -> bytes:
        out = b""
        for step, kind, info in events:
            index = len(self._items) - (0 if step == "open" else 1)
            if step == "open":
                if kind == "text":
                    item = _message_item(_id("msg"), "", "in_progress")
                    item["content"] = []
                elif kind == "reasoning":
                    item = _reasoning_item(_id("rs"), "")
                    item["summary"] = []
                else:
                    named = self.names.responses_call(info["name"])
                    item = _call_item(_id("fc"), info["id"], named, "", "in_progress")
                self._items.append(item)
                out += self._event("response.output_item.added", output_index=index, item=item)
                if kind == "text":
                    out += self._event("response.content_part.added", item_id=item["id"], output_index=index,
                                       content_index=0, part={"type": "output_text", "text": "", "annotations": []})  # fmt: skip
                elif kind == "reasoning":
                    out += self._event("response.reasoning_summary_part.added", item_id=item["id"],
                                       output_index=index, summary_index=0, part={"type": "summary_text", "text": ""})  # fmt: skip
                continue
            item = self._items[index]
            if step == "delta":
                if kind == "text":
                    out += self._event("response.output_text.delta", item_id=item["id"], output_index=index,
                                       content_index=0, delta=info)  # fmt: skip
                elif kind == "reasoning":
                    out += self._event("response.reasoning_summary_text.delta", item_id=item["id"],
                                       output_index=index, summary_index=0, delta=info)  # fmt: skip
                else:
                    out += self._event("response.function_call_arguments.delta", item_id=item["id"],
                                       output_index=index, delta=info)  # fmt: skip
                continue
            text = info["text"]
            if kind == "text":
                part = {"type": "output_text", "text": text, "annotations": []}
                out += self._event("response.output_text.done", item_id=item["id"], output_index=index,
                                   content_index=0, text=text)  # fmt: skip
                out += self._event("response.content_part.done", item_id=item["id"], output_index=index,
                                   content_index=0, part=part)  # fmt: skip
                item.update(content=[part], status="completed")
            elif kind == "reasoning":
                out += self._event("response.reasoning_summary_text.done", item_id=item["id"],
                                   output_index=index, summary_index=0, text=text)  # fmt: skip
                item["summary"] = [{"type": "summary_text", "text": text}]
            else:
                out += self._event("response.function_call_arguments.done", item_id=item["id"],
                                   output_index=index, arguments=text)  # fmt: skip
                item.pop("namespace", None)
                item.update(arguments=text, status="completed",
                            **self.names.responses_call(info["name"]))  # fmt: skip
            out += self._event("response.output_item.done", output_index=index, item=item)
        return out

    def close(self, completion: dict[str, Any]) -> bytes:
        out = self._render(self.blocks.finish())
        return out + self._event(
            "response.completed", response=self._response("completed", self._items, completion)
        )

    def error_body(self, status: int, error: dict[str, Any]) -> dict[str, Any]:
        return error if "error" in error else {"error": {"message": str(error)[:2000]}}


def _message_item(item_id: str, text: str, status: str) -> dict[str, Any]:
    return {"type": "message", "id": item_id, "status": status, "role": "assistant",
            "content": [{"type": "output_text", "text": text, "annotations": []}]}  # fmt: skip


def _reasoning_item(item_id: str, text: str) -> dict[str, Any]:
    return {"type": "reasoning", "id": item_id, "summary": [{"type": "summary_text", "text": text}]}


def _call_item(
    item_id: str, call_id: Any, named: dict[str, Any], arguments: str, status: str
) -> dict[str, Any]:
    """``named``: ``name`` and, for a namespaced tool, ``namespace`` (``ToolNames``)."""
    return {"type": "function_call", "id": item_id, "call_id": call_id, **named,
            "arguments": arguments, "status": status}  # fmt: skip
