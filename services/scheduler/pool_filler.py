"""PoolFiller: keeps every template's warm pool at its target, and serves claims and hints.

One background task. Each pass (every ``tick_seconds``, or at once when a claim
or a hint wakes it) it folds recent claims into each pool's rate, reads the
member counts from the store, starts member creates up to the target (at most
``parallel_creates`` in flight over all pools, so cold creates still find
backend slots) and, once a pool has held more than its target for
``scale_down_delay_seconds``, removes the surplus oldest-first. During a burst
of claims, refills wait for a pause of ``refill_quiet_seconds`` (member creates
are CPU-heavy runc work that would slow every claim of the burst down) unless
the pool falls under ``refill_low_water`` of its target. A pool whose
creates fail backs off (doubling) instead of spinning on a broken image.

Members are taken out of the pool only by compare-and-set in the store (a
claim, or ``retire_pool_member``), so a member being removed for surplus or
TTL can never also be handed to a client.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable

import structlog

from orchard.common.errors import ServiceError, not_found

from .lifecycle import SandboxLifecycle
from .pools import WarmPool
from .settings import PoolSettings
from .store import POOL_TENANT, SandboxRecord, State
from .templates import Template
from .validation import ValidatedCreate

log = structlog.get_logger("orchard.scheduler")


class PoolFiller:
    def __init__(
        self,
        lifecycle: SandboxLifecycle,
        templates: dict[str, Template],
        settings: PoolSettings,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.lifecycle = lifecycle
        self.settings = settings
        self.clock = clock
        now = clock()
        self.pools = {
            name: WarmPool(
                template,
                now=now,
                rate_window_seconds=settings.rate_window_seconds,
                headroom=settings.headroom,
                hint_hold_seconds=settings.hint_hold_seconds,
            )
            for name, template in sorted(templates.items())
        }
        self._wake = asyncio.Event()
        self._slots = asyncio.Semaphore(settings.parallel_creates)
        self._making: dict[str, set[asyncio.Task[None]]] = {name: set() for name in self.pools}
        self._surplus_since: dict[str, float] = {}
        self._failures: dict[str, int] = {}
        self._backoff_until: dict[str, float] = {}
        self._task: asyncio.Task[None] | None = None
        self._removing: set[asyncio.Task[None]] = set()

    # ---- running ------------------------------------------------------------

    def start(self) -> None:
        if self.pools:
            self._task = asyncio.get_running_loop().create_task(self._loop(), name="pool-filler")

    async def stop(self) -> None:
        """Stop filling; member creates in flight finish (recovery would undo them anyway)."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        in_flight = [t for tasks in self._making.values() for t in tasks] + [*self._removing]
        if in_flight:
            await asyncio.gather(*in_flight, return_exceptions=True)

    async def _loop(self) -> None:
        while True:
            try:
                self.fill_once()
            except Exception:
                log.exception("pool pass failed")
            self._wake.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), self.settings.tick_seconds)

    def wake(self) -> None:
        self._wake.set()

    # ---- client calls ---------------------------------------------------------

    def pool(self, name: str) -> WarmPool:
        pool = self.pools.get(name)
        if pool is None:
            known = ", ".join(self.pools) or "none configured"
            raise not_found(
                f"template {name[:80]!r} not found (templates: {known})", "INVALID_FIELD"
            )
        return pool

    async def claim(self, tenant: str, req: ValidatedCreate, template_name: str) -> SandboxRecord:
        pool = self.pool(template_name)
        rec, outcome = await self.lifecycle.claim(tenant, req, pool.template)
        if outcome != "retry":
            pool.record_claim(hit=outcome == "hit")
            pool.last_claim_at = self.clock()
            self.wake()
        return rec

    def hint(
        self, template_name: str, count: int, within_seconds: float, tenant: str = ""
    ) -> WarmPool:
        pool = self.pool(template_name)
        pool.add_hint(count, within_seconds, self.clock(), tenant)
        self.fill_once()
        return pool

    # ---- one pass -------------------------------------------------------------

    def fill_once(self) -> int:
        """Refresh, then start the member creates each pool needs; returns how many it started."""
        now = self.clock()
        counts = self.lifecycle.store.pool_counts()
        started = 0
        for name, pool in self.pools.items():
            found = counts.get(name, {})
            pool.counts.ready = found.get("ready", 0)
            pool.counts.claimed = found.get("claimed", 0)
            pool.counts.pending = len(self._making[name])
            pool.tick(now)
            if now >= self._backoff_until.get(name, 0.0) and not self._claims_flowing(pool, now):
                for _ in range(pool.to_make()):
                    self._start_member(pool)
                    started += 1
            self._shrink(pool, now)
        return started

    def _claims_flowing(self, pool: WarmPool, now: float) -> bool:
        """Hold refills during a burst of claims while the pool still has enough in hand."""
        if now - pool.last_claim_at >= self.settings.refill_quiet_seconds:
            return False
        in_hand = pool.counts.ready + pool.counts.pending
        return in_hand >= self.settings.refill_low_water * pool.target()

    def _start_member(self, pool: WarmPool) -> None:
        name = pool.template.name
        task = asyncio.get_running_loop().create_task(self._make_member(pool))
        self._making[name].add(task)
        pool.counts.pending += 1
        task.add_done_callback(self._making[name].discard)

    async def _make_member(self, pool: WarmPool) -> None:
        name = pool.template.name
        async with self._slots:
            started = time.monotonic()
            rec = await self.lifecycle.make_pool_member(pool.template)
            seconds = time.monotonic() - started
        if rec.state == State.READY:
            pool.record_create(seconds, ok=True)
            self._failures.pop(name, None)
            self.wake()
            return
        pool.record_create(seconds, ok=False, error=rec.state_reason)
        failures = self._failures.get(name, 0) + 1
        self._failures[name] = failures
        delay = min(self.settings.max_failure_backoff_seconds, 0.5 * 2 ** (failures - 1))
        self._backoff_until[name] = self.clock() + delay
        log.warning(
            "pool member create failed", template=name, error=rec.state_reason, retry_in=delay
        )
        # Nobody saw this member: do not keep a FAILED row for it.
        with contextlib.suppress(ServiceError):
            await self.lifecycle.remove(rec, "pool member failed to start")

    def _shrink(self, pool: WarmPool, now: float) -> None:
        name = pool.template.name
        surplus = pool.counts.ready - max(pool.target(), pool.template.min)
        if surplus <= 0:
            self._surplus_since.pop(name, None)
            return
        since = self._surplus_since.setdefault(name, now)
        if now - since < self.settings.scale_down_delay_seconds:
            return
        self._surplus_since.pop(name, None)
        members = self.lifecycle.store.find(
            tenant=POOL_TENANT, template=name, states=(State.READY,)
        )
        for rec in members[:surplus]:
            retired = self.lifecycle.store.retire_pool_member(rec.id, "warm pool scaled down")
            if retired is not None:
                pool.retired += 1
                task = asyncio.get_running_loop().create_task(
                    self._remove_quietly(retired, "warm pool scaled down")
                )
                self._removing.add(task)
                task.add_done_callback(self._removing.discard)

    async def _remove_quietly(self, rec: SandboxRecord, why: str) -> None:
        try:
            await self.lifecycle.remove(rec, why)
        except ServiceError as exc:
            log.warning("removing a pool member failed; the reaper retries", error=exc.message)

    def metrics(self) -> dict[str, dict[str, float]]:
        """Per template name: the pool's counters and gauges (see ``WarmPool.metrics``)."""
        return {name: pool.metrics() for name, pool in self.pools.items()}
