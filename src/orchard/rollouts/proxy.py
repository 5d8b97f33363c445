"""A client for the recording model proxy's session API (``docs/modelproxy.md``).

The tenant's side of the proxy: create a session with the tenant's Orchard API key, finish it
with the rollout's reward and fault, read its call records and training samples back. The
harness's side (the model calls) needs no client of ours: a harness is given the session's
base URL and speaks OpenAI or Anthropic to it with its own client.

The proxy is a plain HTTP/JSON service, so this is a thin layer over aiohttp (the library the
proxy and the gateway's REST front already use; the ``rollouts`` extra carries it) rather than
a generated client. Every refusal the proxy documents is raised as its own exception class,
keyed by the proxy's ``code`` (:data:`REFUSALS`); an answer that is not the documented shape
(no JSON, a JSONL line that is no object) raises :class:`ProxyProtocolError`, and a proxy that
cannot be reached :class:`ProxyUnreachableError`. Nothing is retried here: a refused
``create_session`` or ``finish`` is the caller's to judge (the runner turns it into an
infrastructure fault).
"""

from __future__ import annotations

import json
import os
import ssl
import urllib.parse
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any, Self

import aiohttp

FAULTS = ("", "task", "infrastructure", "client")
"""The faults ``finish`` takes: none, the task's (scores), the infrastructure's or the
client's (both mask the rollout's samples)."""


class ProxyError(Exception):
    """The proxy refused a call, or could not be reached or understood.

    ``status`` is the HTTP status (0 when no answer came), ``code`` the proxy's error code
    (``SESSION_FORBIDDEN``, ...), ``message`` its explanation.
    """

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(f"model proxy: {status} {code}: {message}" if status else message)
        self.status = status
        self.code = code
        self.message = message


class ProxyUnreachableError(ProxyError):
    """No HTTP answer: connection refused, TLS failure, timeout."""


class ProxyProtocolError(ProxyError):
    """An answer that is not what the proxy documents (not JSON, wrong shape)."""


class ProxyAuthError(ProxyError):
    """401 ``API_KEY_MISSING`` / ``API_KEY_INVALID`` (or ``SESSION_INVALID`` on a model call)."""


class ProxyUnavailableError(ProxyError):
    """503 ``GATEWAY_UNAVAILABLE`` (the proxy cannot ask the gateway about the key) or
    ``UPSTREAM_NOT_CONFIGURED``."""


class SessionForbiddenError(ProxyError):
    """403 ``SESSION_FORBIDDEN``: no session of that id is the tenant's (none, or another's)."""


class SessionFinishedError(ProxyError):
    """403 ``SESSION_FINISHED``: the session takes no more model calls."""


class ProxyLimitError(ProxyError):
    """429 ``SESSION_FULL`` / ``TOO_MANY_CALLS`` / ``TOO_MANY_SESSIONS``: a cap of the proxy."""


class ProxyRequestError(ProxyError):
    """400 ``INVALID_REQUEST`` / ``UNSUPPORTED_FIELD``, 413 ``BODY_TOO_LARGE``, 408
    ``BODY_TIMEOUT``: the request itself was refused."""


class UpstreamError(ProxyError):
    """502 ``UPSTREAM_UNREACHABLE`` / ``UPSTREAM_ANSWER_TOO_LARGE``, 504 ``UPSTREAM_TIMEOUT``."""


REFUSALS: dict[str, type[ProxyError]] = {
    "API_KEY_MISSING": ProxyAuthError,
    "API_KEY_INVALID": ProxyAuthError,
    "SESSION_INVALID": ProxyAuthError,
    "GATEWAY_UNAVAILABLE": ProxyUnavailableError,
    "UPSTREAM_NOT_CONFIGURED": ProxyUnavailableError,
    "SESSION_FORBIDDEN": SessionForbiddenError,
    "SESSION_FINISHED": SessionFinishedError,
    "SESSION_FULL": ProxyLimitError,
    "TOO_MANY_CALLS": ProxyLimitError,
    "TOO_MANY_SESSIONS": ProxyLimitError,
    "INVALID_REQUEST": ProxyRequestError,
    "UNSUPPORTED_FIELD": ProxyRequestError,
    "BODY_TOO_LARGE": ProxyRequestError,
    "BODY_TIMEOUT": ProxyRequestError,
    "UPSTREAM_UNREACHABLE": UpstreamError,
    "UPSTREAM_ANSWER_TOO_LARGE": UpstreamError,
    "UPSTREAM_TIMEOUT": UpstreamError,
}
"""The proxy's documented error codes and the exception each raises; an undocumented code
raises the base :class:`ProxyError` with the code the proxy sent."""


def refusal(status: int, body: bytes) -> ProxyError:
    """The exception for a non-2xx answer ``body`` (the proxy's ``{"error": {...}}`` shape)."""
    try:
        error = json.loads(body)["error"]
        code, message = str(error["code"]), str(error["message"])
    except (ValueError, KeyError, TypeError):
        text = body[:500].decode("utf-8", errors="replace")
        return ProxyProtocolError(status, "NOT_A_PROXY_ERROR", f"unexpected answer: {text!r}")
    return REFUSALS.get(code, ProxyError)(status, code, message)


@dataclass(frozen=True)
class SessionInfo:
    """A session as ``GET /v1/sessions/{id}`` and ``finish`` describe it."""

    id: str
    tenant: str
    model_version: str
    metadata: dict[str, Any]
    created_at: float
    finished_at: float
    reward: float | None
    fault: str
    fault_message: str
    calls: int | None = None
    answered_calls: int | None = None
    """Of ``calls``, those the upstream answered (status 200 with an answer); the rest failed."""

    @property
    def finished(self) -> bool:
        return self.finished_at > 0

    @classmethod
    def parse(cls, body: dict[str, Any]) -> SessionInfo:
        try:
            return cls(
                id=str(body["id"]), tenant=str(body["tenant"]),
                model_version=str(body.get("model_version", "")),
                metadata=dict(body.get("metadata") or {}),
                created_at=float(body.get("created_at") or 0.0),
                finished_at=float(body.get("finished_at") or 0.0),
                reward=None if body.get("reward") is None else float(body["reward"]),
                fault=str(body.get("fault", "")), fault_message=str(body.get("fault_message", "")),
                calls=None if body.get("calls") is None else int(body["calls"]),
                answered_calls=(
                    None if body.get("answered_calls") is None else int(body["answered_calls"])
                ),
            )  # fmt: skip
        except (KeyError, TypeError, ValueError) as err:
            raise ProxyProtocolError(200, "BAD_SESSION", f"not a session: {err!r}") from None


@dataclass(frozen=True)
class ProxySession:
    """A new session: its id, its credential (given only once) and the base URLs a harness is
    pointed at (the credential is in their path)."""

    info: SessionInfo
    credential: str = field(repr=False)
    openai_base_url: str = field(repr=False)
    anthropic_base_url: str = field(repr=False)

    @property
    def id(self) -> str:
        return self.info.id


def _json_object(data: bytes, where: str) -> dict[str, Any]:
    try:
        value = json.loads(data)
    except ValueError:
        raise ProxyProtocolError(200, "NOT_JSON", f"{where}: not JSON: {data[:200]!r}") from None
    if not isinstance(value, dict):
        raise ProxyProtocolError(200, "NOT_AN_OBJECT", f"{where}: not a JSON object")
    return value


def _quoted(session_id: str) -> str:
    return urllib.parse.quote(session_id, safe="")


def local_proxy_url(home: str | os.PathLike[str] | None = None) -> str:
    """The proxy ``orchard up`` started in ``home`` (default ``$ORCHARD_HOME`` or
    /var/lib/orchard): the URL it wrote to ``<home>/run/modelproxy.addr``."""
    root = Path(home or os.environ.get("ORCHARD_HOME") or "/var/lib/orchard")
    path = root / "run" / "modelproxy.addr"
    try:
        return path.read_text().strip()
    except OSError as err:
        raise ProxyUnreachableError(
            0, "NO_PROXY", f"no model proxy address at {path} (is `orchard up` running?): {err}"
        ) from None


class ModelProxyClient:
    """The tenant's calls to one proxy (``url``: ``http(s)://host:port``) under ``api_key``.

    ``ca`` (a PEM path or an ``ssl.SSLContext``) is what an HTTPS proxy is trusted by (under
    ``orchard up --tls``: ``<home>/run/ca.pem``). Use as ``async with``; one client serves
    many concurrent sessions (one connection pool).
    """

    def __init__(
        self,
        url: str,
        api_key: str,
        *,
        ca: str | os.PathLike[str] | ssl.SSLContext | None = None,
        timeout: float = 60.0,
    ) -> None:
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"model proxy url must be http(s)://host:port, not {url!r}")
        if not api_key:
            raise ValueError("model proxy: an API key is required")
        self.url = url.rstrip("/")
        self._api_key = api_key
        if ca is None or isinstance(ca, ssl.SSLContext):
            self._ssl: ssl.SSLContext | bool = ca if ca is not None else True
        else:
            self._ssl = ssl.create_default_context(cafile=os.fspath(ca))
        self._timeout = aiohttp.ClientTimeout(total=timeout)
        self._http: aiohttp.ClientSession | None = None

    def __repr__(self) -> str:
        return f"<ModelProxyClient {self.url}>"

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self, _t: type[BaseException] | None, _e: BaseException | None, _tb: TracebackType | None
    ) -> None:
        await self.close()

    async def close(self) -> None:
        if self._http is not None:
            await self._http.close()
            self._http = None

    def _session(self) -> aiohttp.ClientSession:
        if self._http is None or self._http.closed:
            self._http = aiohttp.ClientSession(
                timeout=self._timeout,
                headers={"Authorization": f"Bearer {self._api_key}"},
                connector=aiohttp.TCPConnector(ssl=self._ssl, limit=64),
            )
        return self._http

    async def _call(self, method: str, path: str, body: dict[str, Any] | None = None) -> bytes:
        try:
            async with self._session().request(method, self.url + path, json=body) as answer:
                data = await answer.read()
                if answer.status >= 400:
                    raise refusal(answer.status, data)
                return data
        except (aiohttp.ClientError, TimeoutError, ssl.SSLError) as err:
            raise ProxyUnreachableError(
                0, "UNREACHABLE", f"model proxy {self.url}: {type(err).__name__}: {err}"
            ) from err

    async def _object(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        return _json_object(await self._call(method, path, body), path)

    async def _jsonl(self, path: str) -> list[dict[str, Any]]:
        data = await self._call("GET", path)
        return [
            _json_object(line, f"{path}: line {n}")
            for n, line in enumerate(data.splitlines(), 1)
            if line.strip()
        ]

    async def create_session(
        self, model_version: str = "", metadata: dict[str, Any] | None = None
    ) -> ProxySession:
        """A new session (``model_version``: the policy version recorded on every call)."""
        body = await self._object(
            "POST", "/v1/sessions", {"model_version": model_version, "metadata": metadata or {}}
        )
        try:
            credential = str(body["credential"])
            openai_url, anthropic_url = (
                str(body["openai_base_url"]),
                str(body["anthropic_base_url"]),
            )
        except KeyError as err:
            raise ProxyProtocolError(200, "BAD_SESSION", f"new session lacks {err}") from None
        return ProxySession(SessionInfo.parse(body), credential, openai_url, anthropic_url)

    async def session(self, session_id: str) -> SessionInfo:
        return SessionInfo.parse(await self._object("GET", f"/v1/sessions/{_quoted(session_id)}"))

    async def finish(
        self,
        session_id: str,
        reward: float | None = None,
        fault: str = "",
        fault_message: str = "",
    ) -> SessionInfo:
        """Close the session to model calls and attach the rollout's reward and fault (a fault
        from :data:`FAULTS`); again to correct the reward."""
        if fault not in FAULTS:
            raise ValueError(f"fault must be one of {FAULTS}, not {fault!r}")
        body = {"reward": reward, "fault": fault, "fault_message": fault_message[:4096]}
        return SessionInfo.parse(
            await self._object("POST", f"/v1/sessions/{_quoted(session_id)}/finish", body)
        )

    async def calls(self, session_id: str) -> list[dict[str, Any]]:
        """The session's call records (``docs/modelproxy.md``, "What is recorded")."""
        return await self._jsonl(f"/v1/sessions/{_quoted(session_id)}/calls")

    async def samples(self, session_id: str) -> list[dict[str, Any]]:
        """The session's training samples, one per branch of its message graph."""
        return await self._jsonl(f"/v1/sessions/{_quoted(session_id)}/samples")
