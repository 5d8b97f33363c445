"""The gateway: the public SandboxService endpoint.

It checks the caller's API key (``auth.ApiKeyAuth``), then forwards the call to
the scheduler with the tenant in ``orchard-tenant`` metadata
(``service.GatewayService``). Data-plane calls (exec, files) do not come here:
clients reach the executor directly with the address and token from the
create answer.
"""
