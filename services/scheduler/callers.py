"""Who may call the scheduler: the gateway, and nobody else, for every RPC that acts for a tenant.

The scheduler believes the ``orchard-tenant`` and ``orchard-quota`` metadata of its caller
(the gateway checked the API key and looked up the quota), so that caller must prove it is
the gateway: every call arrives over mutual TLS with a certificate of the internal CA
(``orchard.common.internal_pki``), and this policy allows SandboxService and PoolService to
the ``gateway`` identity only. The health service answers any internal identity (a probe
run by an operator with a service's certificate); the kubelet's gRPC probe, which cannot
present a certificate, asks the plaintext health-only port (``--health-listen``). Any RPC
service added later is refused until it is named here.
"""

from __future__ import annotations

from orchard.common.caller_policy import ANY_SERVICE, CallerPolicy

SCHEDULER_CALLERS = CallerPolicy(
    "scheduler",
    {
        "orchard.v1.SandboxService": frozenset({"gateway"}),
        "orchard.v1.PoolService": frozenset({"gateway"}),
        "grpc.health.v1.Health": frozenset({ANY_SERVICE}),
    },
)
