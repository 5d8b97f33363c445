"""Per-sandbox data-plane tokens: signed, scoped to one sandbox, expiring.

A token is ``v1.<sandbox_id>.<expiry unix seconds>.<signature>`` where the
signature is HMAC-SHA256 over ``v1.<sandbox_id>.<expiry>`` with the node's key
(``secrets/token.key``, 32 random bytes, made on first use). The control plane
issues tokens; the executor verifies them, so reaching an executor's address is
not enough to use it.
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

_VERSION = "v1"


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


@dataclass(frozen=True)
class TokenSigner:
    key: bytes

    def _sign(self, payload: str) -> str:
        mac = hmac.new(self.key, payload.encode(), hashlib.sha256).digest()
        return base64.urlsafe_b64encode(mac).rstrip(b"=").decode()

    def issue(
        self, sandbox_id: str, ttl_seconds: float, now: float | None = None
    ) -> tuple[str, int]:
        """A token for ``sandbox_id`` and its expiry (unix seconds)."""
        expiry = int((time.time() if now is None else now) + ttl_seconds)
        payload = f"{_VERSION}.{sandbox_id}.{expiry}"
        return f"{payload}.{self._sign(payload)}", expiry

    def verify(self, token: str, sandbox_id: str, now: float | None = None) -> None:
        """Raise :class:`TokenError` unless ``token`` is valid for ``sandbox_id``."""
        parts = token.split(".")
        if len(parts) != 4 or parts[0] != _VERSION:
            raise TokenError("malformed token")
        _, token_sandbox, expiry_text, signature = parts
        payload = f"{_VERSION}.{token_sandbox}.{expiry_text}"
        if not hmac.compare_digest(signature, self._sign(payload)):
            raise TokenError("token signature does not match")
        if token_sandbox != sandbox_id:
            raise TokenError("token is for another sandbox")
        if not expiry_text.isdigit() or int(expiry_text) < (time.time() if now is None else now):
            raise TokenError("token has expired")
