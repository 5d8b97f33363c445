"""LogThrottle: at most a few lines a minute per cause, for lines a sandbox can trigger.

A line a sandbox (or a tenant) can cause at will, e.g. every refused egress
connection, must not let it fill the data directory's logs: each cause (a key,
such as ``("forged-sni", sandbox_id)``) gets ``burst`` lines, then one line per
``every_seconds``, and that line says how many were left out since the last.
The table of causes is bounded; past it, the oldest cause is forgotten.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable, Hashable

MAX_CAUSES = 4096


class LogThrottle:
    def __init__(
        self,
        every_seconds: float = 60.0,
        burst: int = 3,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.every_seconds = every_seconds
        self.burst = burst
        self._clock = clock
        # cause -> [lines left in the burst, when the next line is allowed, suppressed count]
        self._causes: OrderedDict[Hashable, list[float]] = OrderedDict()

    def allow(self, cause: Hashable) -> int | None:
        """None: drop this line. Else the number of lines of this cause dropped before it
        (0 normally), for the line to report as ``suppressed``."""
        now = self._clock()
        state = self._causes.get(cause)
        if state is None:
            if len(self._causes) >= MAX_CAUSES:
                self._causes.popitem(last=False)
            self._causes[cause] = [self.burst - 1, now + self.every_seconds, 0]
            return 0
        self._causes.move_to_end(cause)
        if state[0] > 0:
            state[0] -= 1
            return 0
        if now >= state[1]:
            suppressed = int(state[2])
            state[1], state[2] = now + self.every_seconds, 0
            return suppressed
        state[2] += 1
        return None
