"""Reconcile the store with what the backend really has, once, before serving.

After a crash the two can disagree; the store says what clients were told and
the backend what exists on the node. The rules:

- PENDING in the store (create cut short): remove whatever exists, mark FAILED
  (fault infrastructure: the client never got a READY answer).
- DELETING in the store: finish the delete, mark DELETED.
- READY in the store but gone from the backend: FAILED (infrastructure).
- FAILED in the store but present in the backend: remove the leftover container.
- Present in the backend but unknown to the store (or DELETED there): remove.
"""

from __future__ import annotations

from dataclasses import dataclass

import structlog

from .backends.base import Backend, BackendError
from .store import SandboxStore, State

log = structlog.get_logger("orchard.scheduler")


@dataclass
class RecoveryReport:
    failed: int = 0
    deleted: int = 0
    orphans_removed: int = 0
    errors: int = 0


async def reconcile(store: SandboxStore, backend: Backend) -> RecoveryReport:
    report = RecoveryReport()
    present = {b.sandbox_id for b in await backend.list()}
    known: set[str] = set()

    async def remove(sandbox_id: str) -> bool:
        try:
            await backend.delete(sandbox_id)
        except BackendError as exc:
            report.errors += 1
            log.error("recovery could not remove sandbox", sandbox_id=sandbox_id, error=exc.message)
            return False
        return True

    for rec in store.find(states=(State.PENDING, State.READY, State.DELETING, State.FAILED)):
        known.add(rec.id)
        exists = rec.id in present
        if rec.state == State.PENDING:
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
        elif rec.state == State.READY and not exists:
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
    for sandbox_id in sorted(present - known):
        if await remove(sandbox_id):
            report.orphans_removed += 1
    log.info("recovery done", **report.__dict__)
    return report
