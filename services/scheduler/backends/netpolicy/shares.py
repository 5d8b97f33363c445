"""``Shares``: one node-wide budget (proxy connections, DNS queries waiting), split so
no sandbox and no tenant can take it from the others.

The egress proxy and DNS forwarder serve every sandbox of the node from one
process, so what they hold (fds, tasks, upstream sockets) is a node-wide pool. A
per-sandbox cap alone lets one tenant with many sandboxes take all of it; so each
grant is checked against three caps, in order: the sandbox's, its tenant's, the
node's. With ``per_tenant`` below ``node``, one tenant (however many sandboxes it
has) leaves at least ``node - per_tenant`` to every other tenant. A refusal names
the cap it hit, so the sandbox is told which one (HTTP 429, DNS REFUSED).

Tenants are keys, not names: the local runtime uses the tenant's cgroup group,
Kubernetes the pod's tenant label; a sandbox whose tenant is not known is its own
tenant (it never shares a tenant's budget it may not belong to).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Hashable
from dataclasses import dataclass, field


@dataclass
class Shares:
    per_sandbox: int
    per_tenant: int
    node: int
    what: str
    """What is counted, for refusals ("open proxy connections")."""
    _sandboxes: Counter[Hashable] = field(default_factory=Counter, repr=False)
    _tenants: Counter[Hashable] = field(default_factory=Counter, repr=False)
    total: int = 0

    def __post_init__(self) -> None:
        if min(self.per_sandbox, self.per_tenant, self.node) < 1:
            raise ValueError(f"every cap on {self.what} must be at least 1")

    def acquire(self, sandbox: Hashable, tenant: Hashable) -> str | None:
        """Take one for ``sandbox`` of ``tenant``; None when granted, else why not."""
        if self._sandboxes[sandbox] >= self.per_sandbox:
            return f"this sandbox has {self.per_sandbox} {self.what}, the most it may have"
        if self._tenants[tenant] >= self.per_tenant:
            return (
                f"this sandbox's tenant has {self.per_tenant} {self.what} on this node, "
                "the most one tenant may have"
            )
        if self.total >= self.node:
            return f"this node has {self.node} {self.what}, the most it serves at once"
        self._sandboxes[sandbox] += 1
        self._tenants[tenant] += 1
        self.total += 1
        return None

    def release(self, sandbox: Hashable, tenant: Hashable) -> None:
        """Give back one that :meth:`acquire` granted."""
        for counter, key in ((self._sandboxes, sandbox), (self._tenants, tenant)):
            counter[key] -= 1
            if counter[key] <= 0:
                del counter[key]
        self.total -= 1

    def held(self, sandbox: Hashable | None = None, tenant: Hashable | None = None) -> int:
        if sandbox is not None:
            return self._sandboxes[sandbox]
        if tenant is not None:
            return self._tenants[tenant]
        return self.total
