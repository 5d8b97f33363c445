"""Backend work slots that serve creates before teardowns.

Deletes answer at DELETING and tear down in the background, through the same
bounded slots as creates (runc, mounts and cgroups cost the same CPU either
way). With a plain FIFO semaphore a create that arrives during a burst of
deletes waits behind every queued teardown: in the 1000-user Locust run a
fresh create + exec from another tenant took up to 4-6 s while teardowns were
queued. A client is waiting on a create; nobody waits on a teardown, so
creates go first; within a priority, first come, first served.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

CREATE = 0
TEARDOWN = 1


class PrioritySlots:
    """At most ``limit`` holders; waiters are served lowest priority value first."""

    def __init__(self, limit: int) -> None:
        if limit < 1:
            raise ValueError("slots need a limit >= 1")
        self._free = limit
        self._waiters: list[tuple[int, int, asyncio.Future[None]]] = []
        self._order = itertools.count()

    @asynccontextmanager
    async def hold(self, priority: int) -> AsyncIterator[None]:
        await self._acquire(priority)
        try:
            yield
        finally:
            self._release()

    async def _acquire(self, priority: int) -> None:
        # A free slot means nobody waits: a release hands its slot to the best
        # live waiter and only frees it when none is left.
        if self._free > 0:
            self._free -= 1
            return
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        heapq.heappush(self._waiters, (priority, next(self._order), future))
        try:
            await future
        except asyncio.CancelledError:
            if future.done() and not future.cancelled():
                self._release()  # handed a slot in the same instant it was cancelled
            raise

    def _release(self) -> None:
        while self._waiters:
            _, _, future = heapq.heappop(self._waiters)
            if not future.done():
                future.set_result(None)  # the slot passes straight to the waiter
                return
        self._free += 1
