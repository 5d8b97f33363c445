"""WarmPool: one template's pool arithmetic (counters, claim rate, hints, target). No I/O.

The store holds the members (rows with the template's name and no tenant);
this object holds what the store does not: how fast claims come, how long a
refill takes, live demand hints, and the counters for ``orchard pool ls`` and
metrics. :class:`~.pool_filler.PoolFiller` reads :meth:`target` and makes or
removes members.

How the target is chosen::

    rate     = EWMA of claims per second (time constant ``rate_window_seconds``)
    refill   = EWMA of seconds one member takes to create
    steady   = ceil(rate * refill * headroom)     # claims that arrive during one refill
    hinted   = sandboxes still owed to live hints
    target   = clamp(max(min, steady) + hinted, min, max)

A hint ("N within S seconds", one live hint per tenant and pool: a tenant's
new hint replaces its last) counts from the moment it arrives (so the batch
is warm before it comes) until S + ``hint_hold_seconds`` have passed or N
claims have used it up; each claim pays off the oldest hint first, so a batch
is not counted twice (once as a hint and again as a rate).

Metrics hooks: :meth:`metrics` returns flat counters and gauges
(``orchard_pool_hits_total`` ...) that an exporter can publish as they are.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from .templates import Template


@dataclass
class DemandHint:
    remaining: int
    expires_at: float
    tenant: str = ""


@dataclass
class PoolCounts:
    """How many members the store has (refreshed by the filler)."""

    ready: int = 0
    pending: int = 0
    claimed: int = 0


@dataclass
class WarmPool:
    template: Template
    now: float
    rate_window_seconds: float = 30.0
    headroom: float = 2.0
    hint_hold_seconds: float = 60.0
    hits: int = 0
    misses: int = 0
    created: int = 0
    create_failures: int = 0
    retired: int = 0
    claim_rate: float = 0.0
    refill_seconds: float = 0.0
    counts: PoolCounts = field(default_factory=PoolCounts)
    hints: list[DemandHint] = field(default_factory=list)
    last_error: str = ""
    last_claim_at: float = float("-inf")
    _claims_since_tick: int = 0
    _last_tick: float = 0.0

    def __post_init__(self) -> None:
        self._last_tick = self.now

    # ---- events -------------------------------------------------------------

    def record_claim(self, hit: bool) -> None:
        if hit:
            self.hits += 1
        else:
            self.misses += 1
        self._claims_since_tick += 1
        for hint in self.hints:
            if hint.remaining > 0:
                hint.remaining -= 1
                break

    def record_create(self, seconds: float, ok: bool, error: str = "") -> None:
        if not ok:
            self.create_failures += 1
            self.last_error = error
            return
        self.created += 1
        self.last_error = ""
        self.refill_seconds = (
            seconds if self.refill_seconds == 0 else 0.8 * self.refill_seconds + 0.2 * seconds
        )

    def add_hint(self, count: int, within_seconds: float, now: float, tenant: str = "") -> None:
        """A tenant's plan: ``count`` claims within ``within_seconds``. It replaces the same
        tenant's earlier hint for this pool, so one tenant holds at most one hint per pool
        (a loop of hints cannot grow the list, nor stack up past what it said it needs)."""
        self.hints = [h for h in self.hints if h.tenant != tenant]
        self.hints.append(DemandHint(count, now + within_seconds + self.hint_hold_seconds, tenant))

    def tick(self, now: float) -> None:
        """Fold the claims since the last tick into the rate; drop spent or stale hints."""
        elapsed = now - self._last_tick
        if elapsed > 0:
            instant = self._claims_since_tick / elapsed
            alpha = 1.0 - math.exp(-elapsed / self.rate_window_seconds)
            self.claim_rate += alpha * (instant - self.claim_rate)
            self._claims_since_tick = 0
            self._last_tick = now
        self.hints = [h for h in self.hints if h.remaining > 0 and h.expires_at > now]

    # ---- what to hold -------------------------------------------------------

    @property
    def hinted(self) -> int:
        return sum(h.remaining for h in self.hints)

    def target(self) -> int:
        steady = math.ceil(self.claim_rate * max(self.refill_seconds, 0.05) * self.headroom)
        wanted = max(self.template.min, steady) + self.hinted
        return max(self.template.min, min(self.template.max, wanted))

    def to_make(self) -> int:
        """Members to start now: up to the target, never past ``max`` in the pool."""
        have = self.counts.ready + self.counts.pending
        return max(0, min(self.target(), self.template.max) - have)

    @property
    def hit_rate(self) -> float:
        total = self.hits + self.misses
        return self.hits / total if total else 0.0

    def metrics(self) -> dict[str, float]:
        """Flat counters (``*_total``) and gauges for an exporter; labels: template=<name>."""
        return {
            "orchard_pool_hits_total": self.hits,
            "orchard_pool_misses_total": self.misses,
            "orchard_pool_created_total": self.created,
            "orchard_pool_create_failures_total": self.create_failures,
            "orchard_pool_retired_total": self.retired,
            "orchard_pool_ready": self.counts.ready,
            "orchard_pool_pending": self.counts.pending,
            "orchard_pool_claimed": self.counts.claimed,
            "orchard_pool_target": self.target(),
            "orchard_pool_min": self.template.min,
            "orchard_pool_max": self.template.max,
            "orchard_pool_hinted": self.hinted,
            "orchard_pool_claim_rate": self.claim_rate,
            "orchard_pool_refill_seconds": self.refill_seconds,
        }
