"""Which internal service may call which RPC service: the authorization half of internal mTLS.

The TLS handshake (``internal_pki.ServiceIdentity.server_credentials``) already refused
every caller without a certificate of the internal CA; a call that gets here came from an
Orchard service, and its certificate's common name (``<service>.orchard.internal``, as
gRPC's auth context reports what the handshake verified) says which one.
:class:`CallerPolicy` then allows it by RPC service, and denies by default: an RPC
service not named in the policy (one added later) is PERMISSION_DENIED for everyone until
someone decides who may call it.

The check runs in the error edge (``service_edge.ServiceErrors``, ``authorize=``), before
the handler, for every handler shape, so its refusal leaves as a status with a message
(UNAUTHENTICATED: no verified internal identity, e.g. a call over a socket without TLS;
PERMISSION_DENIED: a known service that may not call this one).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import grpc

from .errors import ServiceError, unauthenticated
from .internal_pki import IDENTITY_SUFFIX

ANY_SERVICE = "*"
"""In a policy: any service with an internal certificate (e.g. for health checks)."""
COMMON_NAME = "x509_common_name"


def caller_service(context: Any) -> str | None:
    """The Orchard service whose internal certificate the TLS handshake verified, or None."""
    try:
        auth = context.auth_context() or {}
    except (AttributeError, RuntimeError):
        return None
    names = auth.get(COMMON_NAME) or []
    if len(names) != 1:
        return None
    name = names[0].decode("ascii", "replace") if isinstance(names[0], bytes) else str(names[0])
    if not name.endswith(IDENTITY_SUFFIX) or name == IDENTITY_SUFFIX:
        return None
    return name[: -len(IDENTITY_SUFFIX)]


@dataclass(frozen=True)
class CallerPolicy:
    """``allowed``: full RPC service name (``orchard.v1.SandboxService``) -> the services
    (``gateway``) that may call it, or ``{ANY_SERVICE}``."""

    server: str
    """This service's name, for the messages."""
    allowed: Mapping[str, frozenset[str]]

    def check(self, context: Any, method: str) -> str:
        """The calling service, if it may call ``method`` (``/pkg.Service/Method``); a
        ServiceError (UNAUTHENTICATED or PERMISSION_DENIED) otherwise."""
        rpc_service = method.lstrip("/").rsplit("/", 1)[0]
        caller = caller_service(context)
        if caller is None:
            raise unauthenticated(
                f"the {self.server} is internal: it accepts only Orchard services that "
                "present their internal certificate (mutual TLS, issued by the internal CA); "
                "clients call the gateway with an API key",
                "INTERNAL_IDENTITY_REQUIRED",
            )
        allowed = self.allowed.get(rpc_service, frozenset())
        if ANY_SERVICE not in allowed and caller not in allowed:
            who = ", ".join(sorted(allowed)) or "no service"
            raise ServiceError(
                grpc.StatusCode.PERMISSION_DENIED,
                "CALLER_NOT_ALLOWED",
                f"the {caller} may not call {rpc_service} on the {self.server} (allowed: {who})",
            )
        return caller


__all__ = ["ANY_SERVICE", "CallerPolicy", "caller_service"]
