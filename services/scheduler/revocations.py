"""Revocations reach the local sandboxes that run their own executor.

The node executor and the gateway read ``<home>/revocations.json`` themselves
(``tokens.Revocations``). A local *injected* or runsc sandbox runs its own
executor inside the sandbox, with its own keys and no such file (it must not
share a node file with sandbox code), and the SDK talks to it directly at
``unix:<home>/sandboxes/<id>/run/executor.sock``: before this, a revoked or
rotated tenant's tokens kept running commands there until they expired.

So the scheduler watches the file (every ``interval``) and, for each tenant
whose moment is new to it, sends a notice (``revocation_delivery``, the code the
Kubernetes pusher uses) to every usable sandbox of that tenant with its own
executor (a record with an ``executor_address``) created before the moment.
The store knows what the backend does not: each sandbox's current tenant (a
claimed warm-pool member's included) and the creation time its tokens' key is
chosen by.

- A create still in flight (PENDING) at the moment is asked about again each
  pass until it is usable, then told.
- A scheduler (re)started after a revocation has seen no moment yet: its first
  pass tells every live sandbox of every revoked tenant created before its
  moment (notices only add, so one told before is told again harmlessly).
- A notice that cannot be delivered is logged and retried every pass; a sandbox
  whose executor has not taken it for ``give_up_seconds`` (stopped, wedged,
  gone) is deleted, with the reason on its record, rather than left to serve the
  revoked tokens when it answers again.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path

import structlog

from orchard.common.tokens import Revocations, TokenSigner

from .revocation_delivery import NoticeDelivery, NoticeTarget, PassLoop, PassResult
from .store import SandboxStore, State

log = structlog.get_logger("orchard.scheduler.revocations")

ASKED_STATES = (State.PENDING, State.READY, State.CLAIMED)
"""PENDING: a create in flight, asked about again until it is usable."""


class SandboxRevocations:
    """Tells the store's sandboxes with their own executor of their tenant's revocations."""

    def __init__(
        self,
        revocations_file: Path,
        signer: TokenSigner,
        store: SandboxStore,
        remove: Callable[[str, str], Awaitable[None]],
        *,
        interval_seconds: float,
        give_up_seconds: float,
    ) -> None:
        self._revocations = Revocations(revocations_file)
        self._store = store
        self._remove = remove
        """(sandbox id, why): delete a sandbox that could not be told."""
        self._delivery = NoticeDelivery(signer, give_up_seconds=give_up_seconds)
        self._loop = PassLoop("revocation-notices", self.push_once, interval_seconds)
        self._seen: dict[str, float] = {}
        """Tenant -> the moment every sandbox of it has been told (or was created after)."""
        self._again: set[str] = set()
        """Tenants with a sandbox not told yet: asked about again next pass."""

    @property
    def pushed(self) -> int:
        return self._delivery.pushed

    def start(self) -> None:
        self._loop.start()

    async def stop(self) -> None:
        await self._loop.stop()

    async def push_once(self) -> PassResult:
        """One pass: tell every sandbox that needs it; delete the overdue ones."""
        table = self._revocations.table()
        tenants = {t for t, before in table.items() if self._seen.get(t) != before}
        tenants |= self._again & table.keys()
        again: set[str] = set()
        targets: list[NoticeTarget] = []
        for tenant in sorted(tenants):
            before = table[tenant]
            for rec in self._store.find(tenant=tenant, states=ASKED_STATES):
                if rec.created_at >= before:
                    continue  # every token of it is issued after the moment
                if rec.state == State.PENDING:
                    again.add(tenant)  # its executor address is known once it is usable
                    continue
                if not rec.executor_address:
                    continue  # the node executor serves it, and reads the file itself
                targets.append(NoticeTarget(rec.id, tenant, rec.executor_address, rec.created_at))
        result = await self._delivery.deliver(table, targets)
        again.update(t.tenant for t in result.failed)
        for tenant in tenants:
            self._seen[tenant] = table[tenant]
        self._again = again
        # What was acknowledged matters only while a tenant is asked about again.
        self._delivery.forget(lambda _sandbox_id, tenant: tenant in again)
        for target in result.overdue:
            await self._give_up(target)
        return result

    async def _give_up(self, target: NoticeTarget) -> None:
        why = (
            f"its executor did not take the revocation of tenant {target.tenant!r}'s tokens "
            "(ExecutorService.Revoke failed past the give-up bound)"
        )
        log.error("deleting a sandbox that could not be told of a revocation",
                  sandbox_id=target.sandbox_id, tenant=target.tenant)  # fmt: skip
        await self._remove(target.sandbox_id, why)
