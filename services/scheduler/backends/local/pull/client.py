"""The distribution API client: manifests and blobs over aiohttp, with the registry's auth.

Why our own client: the Python registry clients on PyPI are either Docker-Hub
only, synchronous, unmaintained, or drag in a container engine; a pull needs
four things a small module does well on aiohttp (already the services' HTTP
library): ``GET /v2/<name>/manifests/<ref>`` with the right ``Accept``,
``GET /v2/<name>/blobs/<digest>`` streamed with ``Range`` for resumption, the
401 challenge -> token -> retry dance (:mod:`.auth`) shared by parallel
requests, and redirects followed by hand so credentials never travel to
another origin (blob storage behind a registry answers with a redirect to a
presigned URL that must get no ``Authorization`` header).
"""

from __future__ import annotations

import asyncio
import json
import ssl
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from urllib.parse import urlencode, urljoin, urlsplit

import aiohttp

from .auth import Credentials, parse_challenge
from .errors import (
    MANIFEST_UNKNOWN,
    REGISTRY_ERROR,
    REGISTRY_UNREACHABLE,
    UNAUTHORIZED,
    PullError,
)
from .ref import ImageRef

MAX_REDIRECTS = 5
MAX_TOKEN_BYTES = 1 << 20
USER_AGENT = "orchard-image-pull/1"
TIMEOUT = aiohttp.ClientTimeout(total=None, sock_connect=30, sock_read=120)


def _origin(url: str) -> tuple[str, str]:
    parts = urlsplit(url)
    return parts.scheme, parts.netloc.lower()


async def _error_text(resp: aiohttp.ClientResponse) -> str:
    """The registry's error codes and messages (``{"errors": [...]}``), else the body's start."""
    body = (await resp.content.read(64 << 10)).decode(errors="replace")
    try:
        errors = json.loads(body).get("errors") or []
        return "; ".join(f"{e.get('code', '?')}: {e.get('message', '')}".strip() for e in errors)
    except (ValueError, AttributeError):
        return body.strip()[:300]


class RegistryClient:
    """Requests to one repository on one registry; safe to share between parallel tasks."""

    def __init__(
        self,
        ref: ImageRef,
        session: aiohttp.ClientSession,
        *,
        credentials: Credentials | None = None,
        plain_http: bool = False,
    ) -> None:
        self.ref = ref
        self.session = session
        self.credentials = credentials
        self.base = f"{'http' if plain_http else 'https'}://{ref.api_host}/v2/{ref.repository}"
        self._authorization: str | None = None
        self._auth_lock = asyncio.Lock()

    @staticmethod
    def new_session(ca_file: Path | None = None, connections: int = 16) -> aiohttp.ClientSession:
        context = ssl.create_default_context(cafile=str(ca_file) if ca_file else None)
        connector = aiohttp.TCPConnector(ssl=context, limit=connections)
        return aiohttp.ClientSession(
            connector=connector, timeout=TIMEOUT, headers={"User-Agent": USER_AGENT}
        )

    # -- requests ---------------------------------------------------------------

    async def _send(self, url: str, headers: dict[str, str]) -> aiohttp.ClientResponse:
        """GET ``url``, following redirects; Authorization only to the registry's origin."""
        home = _origin(self.base)
        for _ in range(MAX_REDIRECTS + 1):
            sent = dict(headers)
            if _origin(url) != home:
                sent.pop("Authorization", None)
            try:
                resp = await self.session.get(url, headers=sent, allow_redirects=False)
            except (TimeoutError, aiohttp.ClientError, OSError) as err:
                raise PullError(
                    REGISTRY_UNREACHABLE, f"{self.ref.api_host}: {type(err).__name__}: {err}"
                ) from None
            if resp.status in (301, 302, 303, 307, 308) and "Location" in resp.headers:
                url = urljoin(url, resp.headers["Location"])
                resp.release()
                continue
            return resp
        raise PullError(REGISTRY_ERROR, f"{self.ref.api_host}: too many redirects")

    @asynccontextmanager
    async def get(
        self, path: str, headers: dict[str, str]
    ) -> AsyncIterator[aiohttp.ClientResponse]:
        """GET ``<base>/<path>``, authenticating on a 401 challenge; yields a 2xx response
        (the caller reads it). 401/403 after authenticating, 404 and other errors raise."""
        url = f"{self.base}/{path}"
        for attempt in range(2):
            sent = dict(headers)
            used = self._authorization
            if used:
                sent["Authorization"] = used
            resp = await self._send(url, sent)
            try:
                if resp.status == 401 and attempt == 0:
                    challenge = resp.headers.get("WWW-Authenticate", "")
                    await self._authenticate(challenge, used)
                    continue
                if resp.status in (401, 403):
                    who = f"user {self.credentials.username!r}" if self.credentials else "anonymous"
                    raise PullError(
                        UNAUTHORIZED,
                        f"{self.ref}: {self.ref.api_host} refused access ({resp.status}, {who}): "
                        f"{await _error_text(resp)}",
                    )
                if resp.status == 404:
                    raise PullError(
                        MANIFEST_UNKNOWN,
                        f"{self.ref}: not found on {self.ref.api_host} ({path}): "
                        f"{await _error_text(resp)}",
                    )
                if resp.status >= 300:
                    raise PullError(
                        REGISTRY_ERROR,
                        f"{self.ref}: {self.ref.api_host} answered {resp.status} for {path}: "
                        f"{await _error_text(resp)}",
                    )
                try:
                    yield resp
                except (TimeoutError, aiohttp.ClientError, ConnectionError) as err:
                    raise PullError(
                        REGISTRY_UNREACHABLE,
                        f"{self.ref}: reading {path} from {self.ref.api_host} failed: "
                        f"{type(err).__name__}: {err}",
                    ) from None
                return
            finally:
                resp.release()
        raise AssertionError("unreachable")  # pragma: no cover

    # -- authentication ---------------------------------------------------------

    async def _authenticate(self, header: str, failed: str | None) -> None:
        async with self._auth_lock:
            if self._authorization != failed:
                return  # another request re-authenticated while this one waited
            if not header:
                raise PullError(
                    UNAUTHORIZED, f"{self.ref.api_host} answered 401 without a challenge"
                )
            challenge = parse_challenge(header)
            if challenge.scheme == "basic":
                if self.credentials is None:
                    raise PullError(
                        UNAUTHORIZED,
                        f"{self.ref.api_host} asks for a user name and password "
                        "(ORCHARD_REGISTRY_CREDENTIALS or an auth file)",
                    )
                if failed == self.credentials.basic_header():
                    raise PullError(
                        UNAUTHORIZED,
                        f"{self.ref.api_host} refused the password of {self.credentials.username!r}",
                    )
                self._authorization = self.credentials.basic_header()
                return
            self._authorization = "Bearer " + await self._token(challenge.params)

    async def _token(self, params: dict[str, str]) -> str:
        realm = params.get("realm", "")
        if urlsplit(realm).scheme not in ("http", "https"):
            raise PullError(UNAUTHORIZED, f"token realm {realm!r} is not an http(s) URL")
        query = {"scope": params.get("scope") or f"repository:{self.ref.repository}:pull"}
        if params.get("service"):
            query["service"] = params["service"]
        url = f"{realm}{'&' if '?' in realm else '?'}{urlencode(query)}"
        headers = {}
        if self.credentials is not None:
            headers["Authorization"] = self.credentials.basic_header()
        who = f"user {self.credentials.username!r}" if self.credentials else "anonymous"
        try:
            async with self.session.get(url, headers=headers) as resp:
                body = await resp.content.read(MAX_TOKEN_BYTES)
                if resp.status in (401, 403):
                    raise PullError(
                        UNAUTHORIZED,
                        f"token server {urlsplit(realm).netloc} refused {who} "
                        f"({resp.status}) for {query['scope']}",
                    )
                if resp.status != 200:
                    raise PullError(
                        UNAUTHORIZED,
                        f"token server {urlsplit(realm).netloc} answered {resp.status}",
                    )
        except (TimeoutError, aiohttp.ClientError, OSError) as err:
            raise PullError(
                REGISTRY_UNREACHABLE, f"token server {realm}: {type(err).__name__}: {err}"
            ) from None
        try:
            data = json.loads(body)
            token = data.get("token") or data.get("access_token")
        except (ValueError, AttributeError):
            token = None
        if not isinstance(token, str) or not token:
            raise PullError(UNAUTHORIZED, f"token server {realm} sent no token")
        return token
