"""The scheduler's Prometheus gauges, read from its own state at scrape time.

- ``orchard_sandboxes{tenant,state}``: live sandboxes counted in the store
  (warm-pool members that no tenant owns yet are ``tenant="(pool)"``);
- ``orchard_pool_*{template}``: every counter and gauge the warm pools keep
  (``WarmPool.metrics()``: ready, pending, claimed, target, hits, misses, ...).

Reading at scrape time, instead of updating gauges on every state change,
keeps the hot paths untouched and the numbers exactly the store's.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from orchard.common.metrics import SandboxCountCollector, register_collector

from .store import LIVE_STATES, POOL_TENANT, SandboxStore


def sandbox_counts(store: SandboxStore) -> list[tuple[str, str, int]]:
    counts = Counter(
        (r.tenant if r.tenant != POOL_TENANT else "(pool)", r.state.name.lower())
        for r in store.find(states=LIVE_STATES)
    )
    return [(tenant, state, n) for (tenant, state), n in sorted(counts.items())]


class PoolCollector(Collector):
    """One metric family per ``WarmPool.metrics()`` name, labelled by template."""

    def __init__(self, pools: Callable[[], Mapping[str, Any]]) -> None:
        self._pools = pools

    def collect(self) -> Iterable[CounterMetricFamily | GaugeMetricFamily]:
        families: dict[str, CounterMetricFamily | GaugeMetricFamily] = {}
        for template, pool in sorted(self._pools().items()):
            for name, value in pool.metrics().items():
                family = families.get(name)
                if family is None:
                    doc = f"warm pool {name.removeprefix('orchard_pool_').replace('_', ' ')}"
                    family = families[name] = (
                        CounterMetricFamily(name, doc, labels=["template"])
                        if name.endswith("_total")
                        else GaugeMetricFamily(name, doc, labels=["template"])
                    )
                family.add_metric([template], float(value))
        yield from families.values()


def register_scheduler_metrics(
    store: SandboxStore, pools: Callable[[], Mapping[str, Any]]
) -> Callable[[], None]:
    """Register the collectors; returns the undo (for a scheduler stopped in-process)."""
    undo_counts = register_collector(SandboxCountCollector(lambda: sandbox_counts(store)))
    undo_pools = register_collector(PoolCollector(pools))

    def undo() -> None:
        undo_counts()
        undo_pools()

    return undo
