"""TtlReaper: deletes sandboxes whose TTL ran out, and retries stuck deletes.

Each pass first asks the backend which running sandboxes failed behind the
scheduler's back (``SandboxLifecycle.sweep_failures``: Kubernetes preemption,
eviction, OOM) so their records say FAILED with the right fault.

Runs as one background task. Expired sandboxes are removed a few at a time in
parallel (bounded, so a burst of expiries does not starve create calls of the
backend). DELETED records are forgotten a day after their expiry.
"""

from __future__ import annotations

import asyncio
import contextlib

import structlog

from .lifecycle import SandboxLifecycle
from .store import State

log = structlog.get_logger("orchard.scheduler")

FORGET_AFTER_SECONDS = 24 * 3600


class TtlReaper:
    def __init__(
        self, lifecycle: SandboxLifecycle, interval_seconds: float, parallel: int = 8
    ) -> None:
        self.lifecycle = lifecycle
        self.interval_seconds = interval_seconds
        self._limit = asyncio.Semaphore(parallel)
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._loop(), name="ttl-reaper")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def _loop(self) -> None:
        while True:
            try:
                # Failures first: a preempted sandbox is FAILED before it is reaped.
                await self.lifecycle.sweep_failures()
                await self.reap_once()
            except Exception:
                log.exception("reaper pass failed")
            await asyncio.sleep(self.interval_seconds)

    async def reap_once(self) -> int:
        """One pass; returns how many sandboxes it removed."""
        store = self.lifecycle.store
        now = self.lifecycle.clock()
        victims = store.expired(now)
        # A delete whose backend call failed stays DELETING; try it again.
        victims += [
            r for r in store.find(states=(State.DELETING,)) if not self.lifecycle.is_busy(r.id)
        ]

        async def one(rec_id: str, why: str) -> bool:
            async with self._limit:
                # Re-read after the wait: a KeepAlive may have extended the lease,
                # or a claim may have taken a pool member (and reset its expiry),
                # since the pass listed it. Nothing awaits between this check and
                # remove() marking it DELETING, so no claim can slip in between.
                rec = store.get(rec_id)
                if rec is None or (
                    rec.state != State.DELETING and rec.expires_at > self.lifecycle.clock()
                ):
                    return False
                if rec.state == State.PENDING and self.lifecycle.is_busy(rec.id):
                    # Its create is still running: take it on a later pass, once
                    # settled (waiting here would reopen the window for a claim).
                    return False
                try:
                    await self.lifecycle.remove(rec, why)
                except Exception as exc:
                    log.warning("reaper could not delete", sandbox_id=rec_id, error=str(exc))
                    return False
            return True

        results = await asyncio.gather(
            *(
                one(r.id, "ttl expired" if r.state != State.DELETING else r.state_reason)
                for r in victims
            )
        )
        store.purge_deleted(now - FORGET_AFTER_SECONDS)
        return sum(results)
