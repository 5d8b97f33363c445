"""Reconcile the store with what the backend really has, once, before serving.

After a crash the two can disagree; the store says what clients were told and
the backend what exists on the node. The rules:

- PENDING in the store (create cut short): remove whatever exists, mark FAILED
  (fault infrastructure: the client never got a READY answer).
- DELETING in the store: finish the delete, mark DELETED.
- READY or CLAIMED in the store but gone from the backend: FAILED (infrastructure).
- READY or CLAIMED and present: adopted as they are (warm pool members too:
  the pool counts them again at once), with the executor address the backend
  reports for them (a sandbox running its own executor).
- FAILED in the store but present in the backend: remove the leftover container.
- Present in the backend but unknown to the store (or DELETED there): remove.
- Unclaimed warm pool members no client ever saw: whatever is cut short or
  gone ends DELETED, not FAILED, so no row lingers for them.
"""

from __future__ import annotations

from dataclasses import dataclass

import structlog

from .backends.base import Backend, BackendError
from .store import LIVE_STATES, USABLE_STATES, SandboxStore, State

log = structlog.get_logger("orchard.scheduler")


@dataclass
class RecoveryReport:
    failed: int = 0
    deleted: int = 0
    orphans_removed: int = 0
    errors: int = 0


async def reconcile(store: SandboxStore, backend: Backend) -> RecoveryReport:
    report = RecoveryReport()
    listed = await backend.list()
    present = {b.sandbox_id for b in listed}
    stopped = {b.sandbox_id for b in listed if not b.running}
    addresses = {b.sandbox_id: b.executor_address for b in listed}
    known: set[str] = set()

    async def remove(sandbox_id: str) -> bool:
        try:
            await backend.delete(sandbox_id)
        except BackendError as exc:
            report.errors += 1
            log.error("recovery could not remove sandbox", sandbox_id=sandbox_id, error=exc.message)
            return False
        return True

    for rec in store.find(states=LIVE_STATES):
        known.add(rec.id)
        exists = rec.id in present
        if rec.in_pool and rec.state != State.READY:
            if not exists or await remove(rec.id):
                store.set_state(
                    rec.id, State.DELETED, "unclaimed pool member cut short by a restart"
                )
                report.deleted += 1
        elif rec.in_pool and not exists:
            store.set_state(rec.id, State.DELETED, "unclaimed pool member gone at scheduler start")
            report.deleted += 1
        elif rec.state == State.PENDING:
            if not exists or await remove(rec.id):
                store.set_state(
                    rec.id,
                    State.FAILED,
                    "the scheduler restarted while creating this sandbox",
                    "infrastructure",
                    "BACKEND_FAILURE",
                )
                report.failed += 1
        elif rec.state == State.DELETING:
            if not exists or await remove(rec.id):
                store.set_state(
                    rec.id, State.DELETED, rec.state_reason or "deleted during recovery"
                )
                report.deleted += 1
        elif rec.state in USABLE_STATES and rec.id in stopped:
            # The container is there but its init is gone: unusable, remove it.
            await remove(rec.id)
            store.set_state(
                rec.id,
                State.DELETED if rec.in_pool else State.FAILED,
                "the sandbox's init had stopped (found at scheduler start)",
                "infrastructure",
                "BACKEND_FAILURE",
            )
            report.failed += 1
        elif rec.state in USABLE_STATES and not exists:
            store.set_state(
                rec.id,
                State.FAILED,
                "the sandbox's container disappeared (found at scheduler start)",
                "infrastructure",
                "BACKEND_FAILURE",
            )
            report.failed += 1
        elif rec.state == State.FAILED and exists:
            await remove(rec.id)
        elif exists and addresses.get(rec.id, "") != rec.executor_address:
            # Adopted: its own executor's address as the backend sees it now.
            store.set_executor_address(rec.id, addresses.get(rec.id, ""))
    for sandbox_id in sorted(present - known):
        if await remove(sandbox_id):
            report.orphans_removed += 1
    log.info("recovery done", **report.__dict__)
    return report
