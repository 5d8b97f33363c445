"""Waiting out a quota: how long to sleep before retrying a create refused as over quota.

``Sandbox.create(..., wait_for_quota=S)`` retries a create that failed with
:class:`QuotaExceededError` for up to ``S`` seconds. Between tries it sleeps
the server's ``retry-after`` hint when there is one (the gateway computes it
from the tenant's token bucket, so waiting exactly that long is admitted),
else an exponential backoff (0.1 s doubling to 5 s); both with up to 20 %
jitter so that many clients refused together do not come back together. A
refused create made nothing, so retrying it is safe even without a
``request_id``.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable

from ._errors import QuotaExceededError

FIRST_BACKOFF_SECONDS = 0.1
MAX_BACKOFF_SECONDS = 5.0
JITTER = 0.2


class QuotaWait:
    """The retry schedule of one create (pure: the caller sleeps)."""

    def __init__(
        self,
        budget_seconds: float,
        clock: Callable[[], float] = time.monotonic,
        rand: Callable[[], float] = random.random,
    ) -> None:
        self._deadline = clock() + max(0.0, budget_seconds)
        self._clock = clock
        self._rand = rand
        self._backoff = FIRST_BACKOFF_SECONDS

    def next_delay(self, error: QuotaExceededError) -> float | None:
        """Seconds to sleep before the next try, or None to give up and raise ``error``."""
        if error.retry_after is not None and error.retry_after >= 0:
            delay = error.retry_after
        else:
            delay = self._backoff
            self._backoff = min(MAX_BACKOFF_SECONDS, self._backoff * 2)
        delay *= 1.0 + JITTER * self._rand()
        if self._clock() + delay > self._deadline:
            return None
        return delay
