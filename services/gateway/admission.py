"""Create admission at the gateway: per-tenant rate limits and fair queueing.

Two mechanisms, both per tenant, both before the scheduler sees a create:

- :class:`RateLimiter`: a token bucket per tenant (``create_rate`` tokens per
  second, ``create_burst`` deep). An empty bucket answers RESOURCE_EXHAUSTED
  with ``retry-after`` = the time until the next token, so a client that waits
  that long is admitted.
- :class:`FairCreateQueue`: at most ``slots`` creates are in the backend at
  once (the node's real capacity: runc, overlay mounts and cgroup writes on two
  cores); creates beyond that wait in one FIFO queue *per tenant*, and a freed
  slot goes to the tenants in round-robin. A tenant that fires 500 creates
  therefore cannot push a quiet tenant's one create to the back: the quiet
  tenant's create is served after at most one create of every other waiting
  tenant. The time spent waiting is the ``queue`` phase of the metrics.
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict, deque
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager, suppress
from dataclasses import dataclass

from orchard.common.errors import ServiceError, quota_exceeded
from orchard.common.quotas import Quota


@dataclass
class _Bucket:
    tokens: float
    updated: float


class RateLimiter:
    """Token buckets by tenant, sized from each tenant's current quota."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._buckets: dict[str, _Bucket] = {}

    def take(self, tenant: str, quota: Quota) -> ServiceError | None:
        """Take one create token; the error to answer with when the bucket is empty."""
        rate = quota.create_rate
        if rate <= 0:
            return None
        burst = float(quota.create_burst or max(1, int(rate)))
        now = self._clock()
        bucket = self._buckets.get(tenant)
        if bucket is None:
            bucket = self._buckets[tenant] = _Bucket(burst, now)
        bucket.tokens = min(burst, bucket.tokens + (now - bucket.updated) * rate)
        bucket.updated = now
        if bucket.tokens >= 1.0:
            bucket.tokens -= 1.0
            return None
        wait = (1.0 - bucket.tokens) / rate
        return quota_exceeded(
            f"tenant {tenant!r} is over its create rate ({rate:g}/s, burst {burst:g});"
            f" retry in {wait:.2f} s",
            retry_after=wait,
        )


class FairCreateQueue:
    """At most ``slots`` creates at once; waiting creates are served round-robin by tenant."""

    def __init__(self, slots: int) -> None:
        if slots < 1:
            raise ValueError("slots must be >= 1")
        self.slots = slots
        self._busy = 0
        # tenant -> its waiting creates, in arrival order; the dict's order is the
        # round-robin order (a served tenant moves to the back).
        self._waiting: OrderedDict[str, deque[asyncio.Future[None]]] = OrderedDict()

    @property
    def busy(self) -> int:
        return self._busy

    def waiting(self) -> dict[str, int]:
        return {t: len(q) for t, q in self._waiting.items() if q}

    @asynccontextmanager
    async def slot(self, tenant: str) -> AsyncIterator[float]:
        """Hold one create slot for ``tenant``; yields the seconds spent waiting for it."""
        started = time.monotonic()
        if self._busy < self.slots and not self._waiting:
            self._busy += 1
        else:
            future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self._waiting.setdefault(tenant, deque()).append(future)
            try:
                await future
            except asyncio.CancelledError:
                if future.done() and not future.cancelled():
                    # The slot was handed to us just as we were cancelled: pass it on.
                    self._release(tenant)
                else:
                    self._forget(tenant, future)
                raise
        try:
            yield time.monotonic() - started
        finally:
            self._release(tenant)

    def _forget(self, tenant: str, future: asyncio.Future[None]) -> None:
        queue = self._waiting.get(tenant)
        if queue is None:
            return
        with suppress(ValueError):
            queue.remove(future)
        if not queue:
            del self._waiting[tenant]

    def _release(self, tenant: str) -> None:
        """Give the freed slot to the next tenant in round-robin order, or free it.

        The releasing tenant goes to the back first: it just had its turn.
        """
        if tenant in self._waiting and len(self._waiting) > 1:
            self._waiting.move_to_end(tenant)
        while self._waiting:
            tenant, queue = next(iter(self._waiting.items()))
            future = queue.popleft()
            if queue:
                self._waiting.move_to_end(tenant)
            else:
                del self._waiting[tenant]
            if not future.done():
                future.set_result(None)  # the slot passes over: _busy is unchanged
                return
        self._busy -= 1
