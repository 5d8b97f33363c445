"""One model call through the proxy: forward, answer the harness, record.

The same path serves every front (``chat_api``, ``responses_api``, ``messages_api``): the
front's translation gives the Chat body, the upstream answers Chat, the translation gives
the harness its own format back, and the record keeps the harness's request, the upstream's
(reassembled) answer, what the harness got, the token ids and logprobs, and timing.
A streamed answer reaches the harness chunk by chunk as the upstream sends it; the record is
serialised and written after the harness has its whole answer (off its latency).
"""

from __future__ import annotations

import time
from typing import Any, Protocol

from aiohttp import web

from .chat_assembly import ChatAssembler, token_fields
from .errors import ProxyError
from .recording import request_digest
from .sessions import Session
from .upstream import Upstream


class Translation(Protocol):
    api: str

    def to_chat(self) -> dict[str, Any]: ...
    def from_chat(self, completion: dict[str, Any]) -> dict[str, Any]: ...
    def feed(self, chunk: dict[str, Any]) -> bytes: ...
    def close(self, completion: dict[str, Any]) -> bytes: ...
    def error_body(self, status: int, error: dict[str, Any]) -> dict[str, Any]: ...


def _record(
    session: Session, translation: Translation, raw: bytes, chat: dict[str, Any],
    started: float, started_wall: float,
) -> dict[str, Any]:  # fmt: skip
    return {
        "digest": request_digest(translation.api, raw),
        "api": translation.api,
        "request": translation.request,  # type: ignore[attr-defined]
        "upstream_request": chat,
        "model_version": session.info.model_version,
        "started_at": started_wall,
        "stream": bool(chat.get("stream")),
        "not_carried": list(getattr(translation, "not_carried", [])),
        "tool_names": dict(getattr(translation, "tool_names", {})),
        "_t0": started,
    }


def _finish(session: Session, record: dict[str, Any], completion: dict[str, Any] | None,
            status: int, error: Any = None) -> None:  # fmt: skip
    record["total_ms"] = (time.perf_counter() - record.pop("_t0")) * 1000
    record["status"] = status
    record["error"] = error
    prompt, completion_ids, logprobs = (
        token_fields(completion) if completion else (None, None, None)
    )
    record["prompt_token_ids"] = prompt
    record["completion_token_ids"] = completion_ids
    record["completion_logprobs"] = logprobs
    record["response"] = completion
    session.calls.put(record)


async def model_call(
    request: web.Request, session: Session, upstream: Upstream, translation: Translation, raw: bytes
) -> web.StreamResponse:
    chat = upstream.prepare(translation.to_chat())
    record = _record(session, translation, raw, chat, time.perf_counter(), time.time())
    if not chat.get("stream"):
        try:
            status, answer = await upstream.complete(chat)
        except ProxyError as err:  # recorded too: a rollout's infrastructure trouble is evidence
            _finish(session, record, None, err.status, {"code": err.code, "message": err.message})
            raise
        if status != 200:
            _finish(session, record, None, status, answer)
            return web.json_response(translation.error_body(status, answer), status=status)
        prompt, completion_ids, logprobs = token_fields(answer)
        record["first_token_ms"] = None
        client = translation.from_chat(answer)
        record["client_response"] = client if translation.api != "chat" else None
        record["total_ms"] = (time.perf_counter() - record.pop("_t0")) * 1000
        record.update(status=200, error=None, prompt_token_ids=prompt,
                      completion_token_ids=completion_ids, completion_logprobs=logprobs,
                      response=answer if translation.api != "chat" else client)  # fmt: skip
        # the harness has its answer before the record is serialised and written
        answered = web.json_response(client)
        await answered.prepare(request)
        await answered.write_eof()
        session.calls.put(record)
        return answered
    assembler = ChatAssembler()
    response: web.StreamResponse | None = None
    try:
        async for status, event in upstream.stream(chat):
            if status != 200:
                _finish(session, record, None, status, event)
                return web.json_response(translation.error_body(status, event), status=status)
            if response is None:
                record["first_token_ms"] = (time.perf_counter() - record["_t0"]) * 1000
                response = web.StreamResponse(headers={"Content-Type": "text/event-stream",
                                                       "Cache-Control": "no-cache"})  # fmt: skip
                await response.prepare(request)
            assembler.add(event)
            data = translation.feed(event)
            if data:
                await response.write(data)
    except ProxyError as err:
        if response is None:
            _finish(session, record, None, err.status, {"code": err.code, "message": err.message})
            raise
        _finish(
            session, record, assembler.completion(), 200, {"code": err.code, "message": err.message}
        )
        return response  # the harness sees a cut stream, as it would from the upstream
    completion = assembler.completion()
    if response is None:  # an empty 200 stream
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
    tail = translation.close(completion)
    record["client_response"] = None
    await response.write(tail)
    await response.write_eof()
    _finish(session, record, completion, 200)
    return response
