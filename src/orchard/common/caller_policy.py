"""Which internal service may call which RPC service: the authorization half of internal identity.

Every call to an internal service carries a credential signed with its caller's internal
certificate (``internal_credential``; the server's TLS asks for no client certificate, so
a caller without one reaches this check instead of failing in the handshake).
:class:`CallerPolicy` verifies it and then allows the caller by RPC service, denying by
default: an RPC service not named in the policy (one added later) is PERMISSION_DENIED
for everyone until someone decides who may call it.

The check runs in the error edge (``service_edge.ServiceErrors``, ``authorize=``), before
the handler, for every handler shape, so its refusal leaves as a status with a message:
UNAUTHENTICATED when no credential is there (reason INTERNAL_IDENTITY_REQUIRED) or it does
not verify (INTERNAL_IDENTITY_INVALID: another CA, expired, forged, for another service);
PERMISSION_DENIED (CALLER_NOT_ALLOWED) for a verified service that may not call this one.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import grpc

from .errors import ServiceError, unauthenticated
from .internal_credential import HEADER, CredentialError, CredentialVerifier, credential_of

ANY_SERVICE = "*"
"""In a policy: any service with an internal certificate (e.g. for health checks)."""


def caller_service(context: Any, verifier: CredentialVerifier) -> str:
    """The Orchard service whose credential on this call verifies; UNAUTHENTICATED if none."""
    try:
        metadata = context.invocation_metadata()
    except (AttributeError, RuntimeError):
        metadata = None
    value = credential_of(metadata)
    server = verifier.audience
    if value is None:
        raise unauthenticated(
            f"the {server} is internal: this call carries no internal credential "
            f"('{HEADER}' metadata, signed with a certificate of the internal CA, as Orchard's "
            "services send it); clients call the gateway with an API key",
            "INTERNAL_IDENTITY_REQUIRED",
        )
    try:
        return verifier.caller(value)
    except CredentialError as err:
        raise unauthenticated(
            f"the {server} refused this call's internal credential: {err}",
            "INTERNAL_IDENTITY_INVALID",
        ) from None


@dataclass(frozen=True)
class CallerPolicy:
    """``allowed``: full RPC service name (``orchard.v1.SandboxService``) -> the services
    (``gateway``) that may call it, or ``{ANY_SERVICE}``."""

    server: str
    """This service's name, for the messages."""
    allowed: Mapping[str, frozenset[str]]

    def check(self, context: Any, method: str, verifier: CredentialVerifier) -> str:
        """The calling service, if it may call ``method`` (``/pkg.Service/Method``); a
        ServiceError (UNAUTHENTICATED or PERMISSION_DENIED) otherwise."""
        rpc_service = method.lstrip("/").rsplit("/", 1)[0]
        caller = caller_service(context, verifier)
        allowed = self.allowed.get(rpc_service, frozenset())
        if ANY_SERVICE not in allowed and caller not in allowed:
            who = ", ".join(sorted(allowed)) or "no service"
            raise ServiceError(
                grpc.StatusCode.PERMISSION_DENIED,
                "CALLER_NOT_ALLOWED",
                f"the {caller} may not call {rpc_service} on the {self.server} (allowed: {who})",
            )
        return caller

    def authorize(self, verifier: CredentialVerifier) -> Callable[[Any, str], str]:
        """What ``ServiceRunner(authorize=...)`` takes: :meth:`check` with ``verifier``."""
        return lambda context, method: self.check(context, method, verifier)


__all__ = ["ANY_SERVICE", "CallerPolicy", "caller_service"]
