"""The proxy's one error type and its JSON body.

Every refusal is an HTTP status with a JSON body in the OpenAI error shape
(``{"error": {"message", "type", "code"}}``), which the ``openai`` and ``anthropic``
clients both surface as their status errors with the message intact.
"""

from __future__ import annotations

import json
from collections.abc import Set
from typing import Any

from aiohttp import web


class ProxyError(Exception):
    """A request the proxy refuses: ``status`` and a ``code`` a program can match."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message

    def response(self) -> web.Response:
        body = {"error": {"message": self.message, "type": _TYPES.get(self.status, "error"),
                          "code": self.code}}  # fmt: skip
        return web.Response(
            status=self.status, text=json.dumps(body), content_type="application/json"
        )


_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    408: "request_timeout",
    413: "request_too_large",
    429: "rate_limit_error",
    502: "upstream_error",
    504: "upstream_timeout",
}


def bad_request(message: str, code: str = "INVALID_REQUEST") -> ProxyError:
    return ProxyError(400, code, message)


def unsupported(field: str, why: str) -> ProxyError:
    """A field the translation cannot carry to the upstream: named, never dropped silently."""
    return ProxyError(400, "UNSUPPORTED_FIELD", f"{field}: {why}")


def hints_dropped(
    request: dict[str, Any], carried: Set[str], hints: Set[str], api: str
) -> list[str]:
    """The top-level fields of ``request`` outside ``carried``: hints (``hints``) are
    returned to be recorded as not carried; anything else is refused, naming it."""
    dropped = []
    for key in set(request) - carried:
        if key not in hints:
            raise unsupported(key, f"this {api} field cannot be carried onto Chat")
        dropped.append(key)
    return dropped
