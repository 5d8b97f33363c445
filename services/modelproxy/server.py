"""The proxy's HTTP server (aiohttp, already the gateway's REST front's library).

Two faces on one port:

- the tenant's admin calls, authenticated by the tenant's Orchard API key
  (``Authorization: Bearer <key>``, judged by the gateway: ``tenant_keys``)::

      POST /v1/sessions                    {"model_version", "metadata"} -> id, credential, base URLs
      GET  /v1/sessions/{id}               the session and its call count
      POST /v1/sessions/{id}/finish        {"reward", "fault", "fault_message"}
      GET  /v1/sessions/{id}/calls         the records, JSONL
      GET  /v1/sessions/{id}/samples       the training samples, JSONL (``samples``)

- the harness's model calls, admitted by the session credential in the path::

      POST /s/{credential}/v1/chat/completions   OpenAI Chat
      POST /s/{credential}/v1/responses          OpenAI Responses (onto Chat)
      POST /s/{credential}/v1/messages           Anthropic Messages (onto Chat)
      GET  /s/{credential}/v1/models             the upstream's model list (not recorded)

A request body is read with a size cap (413) and a deadline (408) before anything else, so
an oversized or trickled body holds no more than its share.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from typing import Any

import structlog
from aiohttp import web

from .calls import Translation, model_call
from .chat_api import ChatTranslation
from .errors import ProxyError, bad_request
from .messages_api import MessagesTranslation
from .responses_api import ResponsesTranslation
from .samples import samples
from .sessions import Session, SessionStore
from .settings import ModelProxySettings
from .tenant_keys import TenantKeys
from .upstream import Upstream

log = structlog.get_logger("orchard.modelproxy")

TRANSLATIONS: dict[str, Callable[[dict[str, Any]], Translation]] = {
    "chat/completions": ChatTranslation,
    "messages": MessagesTranslation,
    "responses": ResponsesTranslation,
}


class ModelProxy:
    def __init__(
        self,
        settings: ModelProxySettings,
        store: SessionStore,
        keys: TenantKeys,
        upstream: Upstream,
    ) -> None:
        self.settings = settings
        self.store = store
        self.keys = keys
        self.upstream = upstream
        self.public_url = settings.public_url
        self.in_flight: dict[str, int] = {}
        """Model calls in flight, by session id and by ``tenant:<name>``."""

    def app(self) -> web.Application:
        # aiohttp's own cap sits above ours: ours answers first, in the JSON error shape.
        app = web.Application(
            client_max_size=self.settings.max_body_bytes + 1, middlewares=[_errors_as_json]
        )
        app.router.add_post("/v1/sessions", self.create_session)
        app.router.add_get("/v1/sessions/{id}", self.get_session)
        app.router.add_post("/v1/sessions/{id}/finish", self.finish_session)
        app.router.add_get("/v1/sessions/{id}/calls", self.session_calls)
        app.router.add_get("/v1/sessions/{id}/samples", self.session_samples)
        for path in TRANSLATIONS:
            app.router.add_post(f"/s/{{credential}}/v1/{path}", self.model_call)
        app.router.add_get("/s/{credential}/v1/models", self.list_models)
        return app

    async def read_body(self, request: web.Request) -> bytes:
        cap = self.settings.max_body_bytes
        if request.content_length is not None and request.content_length > cap:
            raise ProxyError(413, "BODY_TOO_LARGE", f"request body over {cap} bytes")
        chunks: list[bytes] = []
        size = 0
        try:
            async with asyncio.timeout(self.settings.body_timeout_seconds):
                async for chunk in request.content.iter_any():
                    size += len(chunk)
                    if size > cap:
                        raise ProxyError(413, "BODY_TOO_LARGE", f"request body over {cap} bytes")
                    chunks.append(chunk)
        except TimeoutError:
            raise ProxyError(
                408, "BODY_TIMEOUT",
                f"request body not received in {self.settings.body_timeout_seconds:g} s",
            ) from None  # fmt: skip
        return b"".join(chunks)

    async def json_body(self, request: web.Request) -> tuple[bytes, dict[str, Any]]:
        raw = await self.read_body(request)
        try:
            body = json.loads(raw) if raw else {}
        except ValueError as err:
            raise bad_request(f"request body is not JSON: {err}") from None
        if not isinstance(body, dict):
            raise bad_request("request body must be a JSON object")
        return raw, body

    # ---- the harness's calls ---------------------------------------------------------

    async def model_call(self, request: web.Request) -> web.StreamResponse:
        session = self.store.by_credential(request.match_info["credential"])
        if session.info.finished:
            raise ProxyError(403, "SESSION_FINISHED", f"session {session.info.id} is finished")
        session.calls.admit()
        if not self.upstream.configured:
            raise ProxyError(503, "UPSTREAM_NOT_CONFIGURED",
                             "the proxy has no upstream (--upstream, $ORCHARD_MODEL_UPSTREAM)")  # fmt: skip
        shares = ((session.info.id, self.settings.max_concurrent_calls_per_session),
                  (f"tenant:{session.info.tenant}", self.settings.max_concurrent_calls_per_tenant))  # fmt: skip
        for key, limit in shares:
            if self.in_flight.get(key, 0) >= limit:
                raise ProxyError(
                    429, "TOO_MANY_CALLS", f"{limit} calls in flight for {key.split(':')[0]}"
                )
        for key, _ in shares:
            self.in_flight[key] = self.in_flight.get(key, 0) + 1
        try:
            raw, body = await self.json_body(request)
            path = request.path.split("/v1/", 1)[1]
            translation = TRANSLATIONS[path](body)
            return await model_call(request, session, self.upstream, translation, raw)
        finally:
            for key, _ in shares:
                self.in_flight[key] -= 1
                if not self.in_flight[key]:
                    del self.in_flight[key]

    async def list_models(self, request: web.Request) -> web.Response:
        self.store.by_credential(request.match_info["credential"])
        if not self.upstream.configured:
            raise ProxyError(503, "UPSTREAM_NOT_CONFIGURED", "the proxy has no upstream")
        status, answer = await self.upstream.models()
        return web.json_response(answer, status=status)

    # ---- the tenant's admin calls ----------------------------------------------------

    async def _tenant(self, request: web.Request) -> str:
        return await self.keys.tenant_of(request.headers.get("Authorization"))

    async def _own_session(self, request: web.Request) -> Session:
        tenant = await self._tenant(request)
        return self.store.of_tenant(tenant, request.match_info["id"])

    def base_url(self, request: web.Request) -> str:
        return self.public_url or f"{request.scheme}://{request.host}"

    async def create_session(self, request: web.Request) -> web.Response:
        tenant = await self._tenant(request)
        _, body = await self.json_body(request)
        model_version = body.get("model_version", "")
        metadata = body.get("metadata", {})
        if not isinstance(model_version, str):
            raise bad_request("model_version: expected a string")
        if not isinstance(metadata, dict):
            raise bad_request("metadata: expected an object")
        unknown = set(body) - {"model_version", "metadata"}
        if unknown:
            raise bad_request(f"unknown fields: {', '.join(sorted(unknown))}")
        session, credential = self.store.create(tenant, model_version, metadata)
        root = f"{self.base_url(request)}/s/{credential}"
        log.info("session created", session=session.info.id, tenant=tenant)
        return web.json_response({
            **session.info.public(), "credential": credential,
            "openai_base_url": f"{root}/v1", "anthropic_base_url": root,
        })  # fmt: skip

    async def get_session(self, request: web.Request) -> web.Response:
        session = await self._own_session(request)
        return web.json_response({
            **session.info.public(), "calls": session.calls.count,
            "answered_calls": session.calls.answered,
        })  # fmt: skip

    async def finish_session(self, request: web.Request) -> web.Response:
        session = await self._own_session(request)
        _, body = await self.json_body(request)
        unknown = set(body) - {"reward", "fault", "fault_message"}
        if unknown:
            raise bad_request(f"unknown fields: {', '.join(sorted(unknown))}")
        fault_message = body.get("fault_message", "")
        if not isinstance(fault_message, str) or not isinstance(body.get("fault", ""), str):
            raise bad_request("fault and fault_message: expected strings")
        count, answered = session.calls.count, session.calls.answered
        self.store.finish(session, body.get("reward"), body.get("fault", ""), fault_message)
        return web.json_response(
            {**session.info.public(), "calls": count, "answered_calls": answered}
        )

    async def session_calls(self, request: web.Request) -> web.Response:
        session = await self._own_session(request)
        lines = "".join(json.dumps(r) + "\n" for r in session.calls.records)
        if session.info.finished:
            session.calls.release()
        return web.Response(text=lines, content_type="application/x-ndjson")

    async def session_samples(self, request: web.Request) -> web.Response:
        session = await self._own_session(request)
        rows = samples(session.calls.records, session.info.public())
        if session.info.finished:
            session.calls.release()
        lines = "".join(json.dumps(r) + "\n" for r in rows)
        return web.Response(text=lines, content_type="application/x-ndjson")


@web.middleware
async def _errors_as_json(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    try:
        return await handler(request)
    except ProxyError as err:
        return err.response()
    except web.HTTPException as exc:  # aiohttp's own (404 route, 405, 413): the JSON shape too
        if exc.status < 400:
            raise
        code = exc.reason.upper().replace(" ", "_")
        return ProxyError(exc.status, code, exc.reason).response()
