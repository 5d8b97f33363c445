"""When ``orchard up`` restarts a crashed service, and when it gives up.

A service that dies (kill -9, an OOM kill, a bug) is restarted on the same
address, so clients, the gateway and the scheduler reach it again without
being told anything new: the sandboxes outlive their services (runc
containers, the executor's state is on disk, the scheduler's in SQLite), so a
restart loses only what was in flight. A service that keeps dying is not
restarted forever: after ``max_crashes`` crashes within ``window_seconds``
``orchard up`` stops the whole stack and exits non-zero, because a crash loop
hides a real fault (a full disk, a broken install) that someone must look at.
Between restarts it waits, doubling from ``first_delay_seconds`` up to
``max_delay_seconds``, so a crash loop does not burn the machine's CPU.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass
class RestartPolicy:
    """Crash bookkeeping for one service: the delay before the next restart, or give up."""

    max_crashes: int = 5
    window_seconds: float = 60.0
    first_delay_seconds: float = 0.2
    max_delay_seconds: float = 8.0
    clock: Callable[[], float] = time.monotonic
    _crashes: list[float] = field(default_factory=list)

    def crashed(self) -> float | None:
        """Record a crash now: seconds to wait before restarting, or None to give up."""
        now = self.clock()
        self._crashes = [t for t in self._crashes if now - t < self.window_seconds]
        self._crashes.append(now)
        if len(self._crashes) >= self.max_crashes:
            return None
        delay: float = self.first_delay_seconds * 2.0 ** (len(self._crashes) - 1)
        return min(delay, self.max_delay_seconds)

    @property
    def recent_crashes(self) -> int:
        return len(self._crashes)
