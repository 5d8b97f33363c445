"""Fair shares of the executor's node-wide pools: per sandbox, per tenant, per node.

One node executor serves every sandbox of the node, so each pool a request
can hold (file-transfer workers, bytes of buffered command output, shell
sessions) is shared by tenants that do not trust each other. Before, each
pool had only a node-wide size: 40 slow WriteFile streams of one sandbox
took all 32 file workers (every other sandbox's reads, writes and
``exec(user=...)`` waited behind them), and three output floods of one
sandbox grew the executor by 1.5 GiB.

A :class:`ShareLedger` counts what each owner (tenant, sandbox) holds of
one pool and admits a new hold only when it fits all three caps: the
sandbox's share, its tenant's share and the node's total. With the
per-tenant share below the node total, one tenant (whatever its number of
sandboxes) always leaves the rest to the others. The owner comes from the
call's verified token (``exec_quota.CALL_CLAIMS``: a tenant cannot claim to
be another); a call without claims (tests of the file service alone)
counts as the anonymous owner ``("", "")``.

Counting is in-process on the event loop, so check-and-add is one step.
"""

from __future__ import annotations

from dataclasses import dataclass

from .exec_quota import CALL_CLAIMS


@dataclass(frozen=True, slots=True)
class Owner:
    """Who holds a share: the token's tenant and sandbox."""

    tenant: str
    sandbox: str


def call_owner(sandbox_id: str = "") -> Owner:
    """The owner of the current call: its token's tenant and sandbox."""
    claims = CALL_CLAIMS.get()
    if claims is None:
        return Owner("", sandbox_id)
    return Owner(claims.tenant, claims.sandbox_id or sandbox_id)


@dataclass(frozen=True, slots=True)
class ShareLimits:
    """The three caps of one pool; 0 or less means no cap at that level."""

    per_sandbox: int
    per_tenant: int
    node: int

    def describe(self, unit: str) -> str:
        return (
            f"{self.per_sandbox} {unit} per sandbox, {self.per_tenant} per tenant, "
            f"{self.node} per node"
        )


class ShareLedger:
    """What each owner holds of one pool, and whether a new hold fits."""

    def __init__(self, limits: ShareLimits, unit: str) -> None:
        self.limits = limits
        self.unit = unit
        self.total = 0
        self._by_sandbox: dict[Owner, int] = {}
        self._by_tenant: dict[str, int] = {}

    def held(self, owner: Owner) -> int:
        return self._by_sandbox.get(owner, 0)

    def tenant_held(self, tenant: str) -> int:
        return self._by_tenant.get(tenant, 0)

    def refusal(self, owner: Owner, amount: int) -> str | None:
        """Why ``amount`` more does not fit for ``owner`` (None: it fits)."""
        limits = self.limits
        held = self._by_sandbox.get(owner, 0)
        if 0 < limits.per_sandbox < held + amount:
            return (
                f"sandbox {owner.sandbox} holds {held} {self.unit} "
                f"(its share is {limits.per_sandbox})"
            )
        tenant_held = self._by_tenant.get(owner.tenant, 0)
        if 0 < limits.per_tenant < tenant_held + amount:
            return (
                f"tenant {owner.tenant!r} holds {tenant_held} {self.unit} "
                f"(its share is {limits.per_tenant})"
            )
        if 0 < limits.node < self.total + amount:
            return (
                f"this node's executor holds {self.total} {self.unit} (its total is {limits.node})"
            )
        return None

    def try_add(self, owner: Owner, amount: int) -> bool:
        if self.refusal(owner, amount) is not None:
            return False
        self.add(owner, amount)
        return True

    def add(self, owner: Owner, amount: int) -> None:
        self._by_sandbox[owner] = self._by_sandbox.get(owner, 0) + amount
        self._by_tenant[owner.tenant] = self._by_tenant.get(owner.tenant, 0) + amount
        self.total += amount

    def remove(self, owner: Owner, amount: int) -> None:
        if amount <= 0:
            return
        left = self._by_sandbox.get(owner, 0) - amount
        if left > 0:
            self._by_sandbox[owner] = left
        else:
            self._by_sandbox.pop(owner, None)
        tenant_left = self._by_tenant.get(owner.tenant, 0) - amount
        if tenant_left > 0:
            self._by_tenant[owner.tenant] = tenant_left
        else:
            self._by_tenant.pop(owner.tenant, None)
        self.total = max(0, self.total - amount)
