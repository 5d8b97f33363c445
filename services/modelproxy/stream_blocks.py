"""Chat chunks as a sequence of content blocks, for the fronts that stream blocks.

Chat streams deltas that interleave freely (text, then tool-call pieces by index); Anthropic
Messages and OpenAI Responses stream *blocks* (items) that open, receive deltas and close, one
at a time. ``BlockStream.feed`` turns one Chat chunk into block events, ``finish`` closes the
last block; the fronts (``messages_api``, ``responses_api``) render the events in their own
wire format. Events::

    ("open", kind, info)   kind "text" | "reasoning" | "tool" (info: id, name for a tool)
    ("delta", kind, text)  text, reasoning text, or a piece of a tool call's JSON arguments
    ("close", kind, info)  info holds the block's whole text / arguments
"""

from __future__ import annotations

from typing import Any

Event = tuple[str, str, Any]


class BlockStream:
    def __init__(self) -> None:
        self.kind: str | None = None
        self.info: dict[str, Any] = {}
        self.tool_index: int | None = None
        self.count = 0
        """Blocks opened so far: the index of the open block is ``count - 1``."""

    def _open(self, kind: str, info: dict[str, Any]) -> list[Event]:
        events = self._close()
        self.kind, self.info = kind, {**info, "text": ""}
        self.count += 1
        return [*events, ("open", kind, self.info)]

    def _close(self) -> list[Event]:
        if self.kind is None:
            return []
        kind, info = self.kind, self.info
        self.kind, self.info, self.tool_index = None, {}, None
        return [("close", kind, info)]

    def _delta(self, kind: str, text: str) -> Event:
        self.info["text"] += text
        return ("delta", kind, text)

    def feed(self, chunk: dict[str, Any]) -> list[Event]:
        events: list[Event] = []
        for choice in chunk.get("choices") or ():
            delta = choice.get("delta") or {}
            reasoning = delta.get("reasoning_content") or delta.get("reasoning")
            if reasoning:
                if self.kind != "reasoning":
                    events += self._open("reasoning", {})
                events.append(self._delta("reasoning", reasoning))
            if delta.get("content"):
                if self.kind != "text":
                    events += self._open("text", {})
                events.append(self._delta("text", delta["content"]))
            for call in delta.get("tool_calls") or ():
                index = int(call.get("index", 0))
                function = call.get("function") or {}
                if self.kind != "tool" or self.tool_index != index:
                    events += self._open("tool", {"id": call.get("id") or f"call_{index}",
                                                  "name": function.get("name") or ""})  # fmt: skip
                    self.tool_index = index
                elif function.get("name"):
                    self.info["name"] += function["name"]
                if function.get("arguments"):
                    events.append(self._delta("tool", function["arguments"]))
        return events

    def finish(self) -> list[Event]:
        return self._close()
