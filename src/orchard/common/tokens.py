"""Per-sandbox data-plane tokens: signed, scoped to one sandbox, expiring.

A token is ``v2.<sandbox_id>.<tenant>.<max_execs>.<expiry unix seconds>.<signature>``
where ``<tenant>`` is the owning tenant's name in unpadded url-safe base64 (a
tenant name may hold dots), ``<max_execs>`` is the tenant's concurrent-exec
quota (0 = unlimited) and the signature is HMAC-SHA256 over everything before
it with the node's key (``secrets/token.key``, 32 random bytes, made on first
use). The control plane issues tokens; the executor verifies them, so reaching
an executor's address is not enough to use it.

Why the tenant and its exec quota ride in the token: the executor is the only
place that sees execs, and it must enforce the tenant's concurrent-exec quota
without a call back to the control plane (on Kubernetes it runs inside the pod,
far from any tenant file). The signature makes both claims unforgeable; a
quota change reaches the executor with the next token (tokens live at most the
scheduler's ``token_ttl_seconds``).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
import secrets
import time
from dataclasses import dataclass
from pathlib import Path

_VERSION = "v2"


class TokenError(Exception):
    """The token is malformed, forged, expired or for another sandbox."""


def load_or_create_key(path: Path) -> bytes:
    """Read the node key, making it (0600, atomically) if it does not exist."""
    try:
        key = path.read_bytes()
    except FileNotFoundError:
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        tmp = path.with_name(f".{path.name}.{os.getpid()}")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(secrets.token_bytes(32))
        try:
            os.link(tmp, path)  # first writer wins; never overwrite a key in use
        except FileExistsError:
            pass
        finally:
            tmp.unlink()
        key = path.read_bytes()
    if len(key) < 32:
        raise TokenError(f"token key {path} is shorter than 32 bytes")
    return key


@dataclass(frozen=True, slots=True)
class TokenClaims:
    """What a verified token says."""

    sandbox_id: str
    tenant: str
    max_execs: int
    """The tenant's concurrent-exec quota on this node; 0 = unlimited."""
    expiry: int


def _b64(text: str) -> str:
    return base64.urlsafe_b64encode(text.encode()).rstrip(b"=").decode()


def _unb64(text: str) -> str:
    try:
        return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4)).decode()
    except (ValueError, UnicodeDecodeError):
        raise TokenError("malformed token") from None


@dataclass(frozen=True)
class TokenSigner:
    key: bytes

    def _sign(self, payload: str) -> str:
        mac = hmac.new(self.key, payload.encode(), hashlib.sha256).digest()
        return base64.urlsafe_b64encode(mac).rstrip(b"=").decode()

    def issue(
        self,
        sandbox_id: str,
        ttl_seconds: float,
        now: float | None = None,
        *,
        tenant: str = "",
        max_execs: int = 0,
    ) -> tuple[str, int]:
        """A token for ``tenant``'s ``sandbox_id`` and its expiry (unix seconds)."""
        expiry = int((time.time() if now is None else now) + ttl_seconds)
        payload = f"{_VERSION}.{sandbox_id}.{_b64(tenant)}.{max(0, int(max_execs))}.{expiry}"
        return f"{payload}.{self._sign(payload)}", expiry

    def verify(self, token: str, sandbox_id: str, now: float | None = None) -> TokenClaims:
        """The token's claims; :class:`TokenError` unless it is valid for ``sandbox_id``.

        The signature is checked before anything else is believed, so a forged
        token cannot even probe which of its fields is wrong.
        """
        parts = token.split(".")
        # Tokens are ASCII; anything else would reach compare_digest (TypeError on
        # non-ASCII str) and str.isdigit (true for other scripts' digits). Found by atheris.
        if not token.isascii() or len(parts) != 6 or parts[0] != _VERSION:
            raise TokenError("malformed token")
        payload, signature = token.rsplit(".", 1)
        if not hmac.compare_digest(signature, self._sign(payload)):
            raise TokenError("token signature does not match")
        _, token_sandbox, tenant_b64, max_execs_text, expiry_text, _ = parts
        if token_sandbox != sandbox_id:
            raise TokenError("token is for another sandbox")
        if not expiry_text.isdigit() or not max_execs_text.isdigit():
            raise TokenError("malformed token")
        if int(expiry_text) < (time.time() if now is None else now):
            raise TokenError("token has expired")
        return TokenClaims(token_sandbox, _unb64(tenant_b64), int(max_execs_text), int(expiry_text))
