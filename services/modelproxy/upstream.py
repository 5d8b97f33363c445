"""The upstream inference server: one pooled HTTP client, token ids and logprobs asked for.

Which fields ask an engine for its tokens differs by engine (``--upstream-kind``):

- ``vllm``: ``logprobs: true`` and ``return_token_ids: true`` (prompt and completion ids in the
  answer, vLLM >= 0.10.2), plus ``return_tokens_as_token_ids`` when the harness did not ask for
  logprobs itself (older vLLM: the ids come back as ``token_id:N`` logprob tokens).
- ``sglang``: ``logprobs: true`` and ``return_token_ids: true``; what SGLang's chat route
  returns differs by release, so samples say when ids were missing (never guessed).
- ``openai``: nothing extra (a server without token ids: samples are not token-exact).

``--upstream-extra-body`` (JSON) overrides or adds fields for any other engine.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import aiohttp

from .errors import ProxyError

TOKEN_REQUESTS: dict[str, dict[str, Any]] = {
    "vllm": {"logprobs": True, "return_token_ids": True},
    "sglang": {"logprobs": True, "return_token_ids": True},
    "openai": {},
}


class Upstream:
    def __init__(
        self, base_url: str, kind: str, api_key: str, timeout_seconds: float,
        extra_body: dict[str, Any] | None = None, max_answer_bytes: int = 64 * 1024 * 1024,
    ) -> None:  # fmt: skip
        if kind not in TOKEN_REQUESTS:
            raise ValueError(f"upstream kind {kind!r}: expected one of {', '.join(TOKEN_REQUESTS)}")
        self.configured = bool(base_url)
        self.url = base_url.rstrip("/") + "/chat/completions"
        self.kind = kind
        self._extra = {**TOKEN_REQUESTS[kind], **(extra_body or {})}
        self._headers = {"Content-Type": "application/json"}
        if api_key:
            self._headers["Authorization"] = f"Bearer {api_key}"
        self._timeout = aiohttp.ClientTimeout(total=timeout_seconds, sock_connect=10)
        self._client: aiohttp.ClientSession | None = None
        self._max_answer = max_answer_bytes

    async def start(self) -> None:
        connector = aiohttp.TCPConnector(limit=1024, keepalive_timeout=60, ttl_dns_cache=300)
        self._client = aiohttp.ClientSession(connector=connector, timeout=self._timeout)

    async def close(self) -> None:
        if self._client is not None:
            await self._client.close()

    def prepare(self, body: dict[str, Any]) -> dict[str, Any]:
        """The Chat body to send upstream: the harness's, with the token fields added."""
        out = {**body, **self._extra}
        if self.kind == "vllm" and not body.get("logprobs"):
            out["return_tokens_as_token_ids"] = True
        if out.get("stream"):
            options = dict(out.get("stream_options") or {})
            options["include_usage"] = True
            out["stream_options"] = options
        return out

    def _session(self) -> aiohttp.ClientSession:
        assert self._client is not None, "Upstream.start() first"
        return self._client

    async def complete(self, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        """(status, JSON answer) of one unstreamed call; 502/504 ProxyError when it fails."""
        try:
            async with self._session().post(
                self.url, data=json.dumps(body), headers=self._headers
            ) as response:
                raw = await self._read_capped(response)
                return response.status, _json_of(raw, response.status)
        except (TimeoutError, aiohttp.ClientError) as exc:
            raise _unreachable(exc) from None

    async def _read_capped(self, response: aiohttp.ClientResponse) -> bytes:
        chunks, size = [], 0
        async for chunk in response.content.iter_any():
            size += len(chunk)
            if size > self._max_answer:
                raise _too_large(self._max_answer)
            chunks.append(chunk)
        return b"".join(chunks)

    async def models(self) -> tuple[int, dict[str, Any]]:
        """The upstream's ``GET /models`` (harnesses list models at start)."""
        try:
            async with self._session().get(
                self.url.removesuffix("/chat/completions") + "/models", headers=self._headers
            ) as response:
                return response.status, _json_of(await self._read_capped(response), response.status)
        except (TimeoutError, aiohttp.ClientError) as exc:
            raise _unreachable(exc) from None

    async def stream(self, body: dict[str, Any]) -> AsyncIterator[tuple[int, dict[str, Any]]]:
        """(status, event) for each SSE ``data:`` event; a non-200 answer comes as one event."""
        try:
            async with self._session().post(
                self.url, data=json.dumps(body), headers=self._headers
            ) as response:
                if response.status != 200:
                    raw = await self._read_capped(response)
                    yield response.status, _json_of(raw, response.status)
                    return
                seen = 0
                async for line in response.content:
                    seen += len(line)
                    if seen > self._max_answer:
                        raise _too_large(self._max_answer)
                    if not line.startswith(b"data:"):
                        continue
                    data = line[5:].strip()
                    if data == b"[DONE]":
                        return
                    yield 200, _json_of(data, 502)
        except (TimeoutError, aiohttp.ClientError) as exc:
            raise _unreachable(exc) from None


def _too_large(cap: int) -> ProxyError:
    return ProxyError(
        502, "UPSTREAM_ANSWER_TOO_LARGE", f"the upstream's answer is over {cap} bytes"
    )


def _unreachable(exc: BaseException) -> ProxyError:
    """A failed upstream call as the harness's error: 504 on a timeout, 502 otherwise."""
    if isinstance(exc, TimeoutError):
        return ProxyError(504, "UPSTREAM_TIMEOUT", "the upstream did not answer in time")
    return ProxyError(502, "UPSTREAM_UNREACHABLE", f"upstream: {exc}")


def _json_of(raw: bytes, status: int) -> dict[str, Any]:
    try:
        value = json.loads(raw)
    except ValueError:
        if status == 200:
            raise ProxyError(502, "UPSTREAM_BAD_ANSWER", "the upstream answered non-JSON") from None
        return {"error": {"message": raw[:2000].decode(errors="replace"), "type": "upstream_error"}}
    if not isinstance(value, dict):
        raise ProxyError(502, "UPSTREAM_BAD_ANSWER", "the upstream answered a non-object")
    return value
