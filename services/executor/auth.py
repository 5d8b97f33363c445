"""The per-call check: a valid sandbox id and a token for exactly that sandbox.

The id is checked first (it becomes part of a path), then the token, and
only then is the sandbox looked up, so a caller without a token cannot even
learn which sandboxes exist. The verified claims (owner tenant, its exec
quota) are left in ``exec_quota.CALL_CLAIMS`` for the rest of the call, and
the tenant is bound to the call's log lines.

A verified token is remembered (per token string and sandbox id, until it
expires), so the HMAC is computed once per token rather than once per call;
only tokens that passed verification are remembered, and the expiry, the
tenant's revocations and the signing key (not dropped since) are still checked on
every call.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from typing import Any

from orchard.common.errors import ServiceError, unauthenticated
from orchard.common.logging import bind_call
from orchard.common.tokens import TokenClaims, TokenError, TokenVerifier, unverified_claims

from .exec_quota import CALL_CLAIMS
from .sandboxes import check_sandbox_id

MAX_TOKEN_CHARS = 1024
# Verified tokens remembered; past this the memory is dropped and refilled.
MAX_REMEMBERED_TOKENS = 4096


def bearer_token(metadata: Iterable[Any] | None) -> str | None:
    """The token of the ``authorization: Bearer <token>`` entry, if any."""
    for key, value in metadata or ():
        if key == "authorization":
            text = value.decode() if isinstance(value, bytes) else str(value)
            scheme, _, token = text.partition(" ")
            if scheme.lower() == "bearer" and token:
                return token.strip()
            return None
    return None


class CallAuthorizer:
    """Checks a call's sandbox id and token."""

    def __init__(self, signer: TokenVerifier, clock: Callable[[], float] = time.time) -> None:
        self._signer = signer
        self._clock = clock
        self._verified: dict[tuple[str, str], TokenClaims] = {}

    def check(self, sandbox_id: str, metadata: Iterable[Any] | None) -> TokenClaims:
        check_sandbox_id(sandbox_id)
        token = bearer_token(metadata)
        if token is None:
            raise _token_invalid("missing 'authorization: Bearer <token>' metadata")
        if len(token) > MAX_TOKEN_CHARS:
            raise _token_invalid("token is too long")
        claims = self._verified_claims(token, sandbox_id)
        CALL_CLAIMS.set(claims)
        bind_call(tenant=claims.tenant)
        return claims

    def check_before_first_message(self, metadata: Iterable[Any] | None) -> None:
        """For a request stream, before its first message (which names the sandbox): the
        token must be valid for the sandbox it names itself, so a caller with a missing,
        forged, expired or revoked token is refused at once instead of holding the
        stream open until the idle bound. The check on the first message (its sandbox
        id against the token's) still runs."""
        token = bearer_token(metadata)
        if token is None:
            raise _token_invalid("missing 'authorization: Bearer <token>' metadata")
        if len(token) > MAX_TOKEN_CHARS:
            raise _token_invalid("token is too long")
        try:
            sandbox_id, _ = unverified_claims(token)
            check_sandbox_id(sandbox_id)
        except (TokenError, ServiceError):
            raise _token_invalid("malformed token") from None
        self._verified_claims(token, sandbox_id)

    def revoke(self, sandbox_id: str, notice: str) -> tuple[str, float]:
        """Apply a revocation notice for ``sandbox_id`` (signed with its own key): every
        token of its tenant issued before its moment is refused from the next call on,
        remembered ones included. Returns (tenant, before)."""
        check_sandbox_id(sandbox_id)
        if len(notice) > MAX_TOKEN_CHARS:
            raise _notice_invalid("notice is too long")
        try:
            tenant, before = self._signer.verify_revocation(notice, sandbox_id, now=self._clock())
            self._signer.revocations.note(tenant, before)
        except TokenError as exc:
            raise _notice_invalid(str(exc)) from None
        return tenant, before

    def drop_key(self, sandbox_id: str, notice: str) -> tuple[str, bool]:
        """Apply a key-drop notice for ``sandbox_id`` (signed with its own key of a live key
        id): tokens signed with the dropped key are refused from the next call on,
        remembered ones included. Returns (dropped key id, whether it was held)."""
        check_sandbox_id(sandbox_id)
        if len(notice) > MAX_TOKEN_CHARS:
            raise _notice_invalid("notice is too long")
        try:
            kid = self._signer.verify_key_drop(notice, sandbox_id)
        except TokenError as exc:
            raise _notice_invalid(str(exc)) from None
        return kid, self._signer.drop_key(kid)

    def _verified_claims(self, token: str, sandbox_id: str) -> TokenClaims:
        key = (token, sandbox_id)
        claims = self._verified.get(key)
        if claims is not None:
            if claims.expiry < self._clock():
                del self._verified[key]
            elif not self._signer.knows_key(claims.kid, sandbox_id):
                del self._verified[key]
                raise _token_invalid("token signed with an unknown key (it was dropped)")
            elif self._signer.revocations.is_revoked(claims):
                del self._verified[key]
                raise _token_invalid(
                    "token was revoked (its tenant's keys were revoked or rotated)"
                )
            else:
                return claims
        try:
            claims = self._signer.verify(token, sandbox_id, now=self._clock())
        except TokenError as exc:
            raise _token_invalid(str(exc)) from None
        if len(self._verified) >= MAX_REMEMBERED_TOKENS:
            self._verified.clear()
        self._verified[key] = claims
        return claims


def _notice_invalid(message: str) -> ServiceError:
    return unauthenticated(f"revocation notice refused: {message}", "REVOCATION_INVALID")


def _token_invalid(message: str) -> ServiceError:
    return unauthenticated(f"sandbox token refused: {message}", "TOKEN_INVALID")
