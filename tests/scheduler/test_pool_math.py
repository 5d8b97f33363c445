"""WarmPool arithmetic with a hand-driven clock: rate, refill latency, hints, bounds."""

from __future__ import annotations

from orchard.scheduler.pools import WarmPool
from orchard.scheduler.templates import Template


def _pool(min_: int = 2, max_: int = 50) -> WarmPool:
    return WarmPool(Template("t", min=min_, max=max_), now=0.0, rate_window_seconds=10.0)


def test_idle_pool_targets_its_min() -> None:
    pool = _pool()
    pool.tick(5.0)
    assert pool.target() == 2
    pool.counts.ready = 1
    assert pool.to_make() == 1


def test_target_grows_with_the_claim_rate_and_refill_time_and_decays() -> None:
    pool = _pool()
    pool.record_create(1.0, ok=True)  # one member takes ~1 s
    now = 0.0
    for _ in range(60):  # 10 claims/s for 6 s
        now += 0.1
        pool.record_claim(hit=True)
        pool.tick(now)
    assert 4.0 < pool.claim_rate < 10.0
    grown = pool.target()
    assert grown > 2 * 4  # rate x refill x headroom(2)
    for _ in range(100):  # then nothing for 100 s
        now += 1.0
        pool.tick(now)
    assert pool.claim_rate < 0.01 and pool.target() == 2


def test_target_is_bounded_by_max() -> None:
    pool = _pool(max_=5)
    pool.record_create(10.0, ok=True)
    pool.add_hint(100, 5.0, now=0.0)
    assert pool.target() == 5
    pool.counts.ready, pool.counts.pending = 3, 2
    assert pool.to_make() == 0


def test_hint_raises_the_target_until_claims_use_it_up() -> None:
    pool = _pool(min_=0)
    pool.add_hint(8, 30.0, now=0.0)
    assert pool.hinted == 8 and pool.target() == 8
    for _ in range(5):
        pool.record_claim(hit=True)
    assert pool.hinted == 3
    for _ in range(3):
        pool.record_claim(hit=False)
    pool.tick(1.0)
    assert pool.hints == [] and pool.hinted == 0


def test_a_tenants_new_hint_replaces_its_last_so_hints_cannot_pile_up() -> None:
    pool = _pool(min_=0, max_=50)
    for i in range(10_000):  # a hostile loop of hints
        pool.add_hint(5, 30.0, now=float(i) / 1000, tenant="mallory")
    assert len(pool.hints) == 1 and pool.hinted == 5
    pool.add_hint(3, 30.0, now=11.0, tenant="alice")
    assert pool.hinted == 8 and len(pool.hints) == 2
    pool.add_hint(1, 30.0, now=12.0, tenant="alice")  # alice's plan changed
    assert pool.hinted == 6


def test_stale_hint_expires_after_its_window_and_hold() -> None:
    pool = _pool(min_=0)
    pool.hint_hold_seconds = 60.0
    pool.add_hint(4, 10.0, now=0.0)
    pool.tick(69.0)
    assert pool.hinted == 4
    pool.tick(71.0)
    assert pool.hinted == 0


def test_counters_and_metrics() -> None:
    pool = _pool()
    pool.record_claim(hit=True)
    pool.record_claim(hit=True)
    pool.record_claim(hit=False)
    pool.record_create(0.2, ok=True)
    pool.record_create(0.0, ok=False, error="image missing")
    assert round(pool.hit_rate, 3) == 0.667
    metrics = pool.metrics()
    assert metrics["orchard_pool_hits_total"] == 2
    assert metrics["orchard_pool_misses_total"] == 1
    assert metrics["orchard_pool_create_failures_total"] == 1
    assert pool.last_error == "image missing"
