"""Warm pools from the client side: what ``client.pools`` returns and sends.

client = orchard.Orchard()
client.pools.hint("py-small", 64, within=30)   # a batch of 64 claims within 30 s
for pool in client.pools.list():
    print(pool.template, pool.ready, pool.target, pool.hit_rate)
with client.sandboxes.create(template="py-small", env={"TASK": "42"}) as sb: ...
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from orchard._proto.orchard.v1 import pools_pb2

from ._errors import InvalidRequestError


@dataclass(frozen=True)
class PoolInfo:
    """One template's warm pool as the scheduler reports it."""

    template: str
    image: str
    cpu: float
    """Cores per sandbox."""
    memory_bytes: int
    ready: int
    """Warm, unclaimed sandboxes."""
    pending: int
    claimed: int
    min: int
    max: int
    target: int
    hits: int
    misses: int
    hit_rate: float
    claim_rate: float
    """Smoothed claims per second."""
    refill_seconds: float
    """Smoothed seconds to make one sandbox."""
    hinted: int
    """Sandboxes still owed to live hints."""


def pool_info(msg: pools_pb2.PoolStatus) -> PoolInfo:
    t = msg.template
    return PoolInfo(
        template=t.name,
        image=t.image,
        cpu=t.resources.cpu_millis / 1000,
        memory_bytes=t.resources.memory_bytes,
        ready=msg.ready,
        pending=msg.pending,
        claimed=msg.claimed,
        min=msg.min,
        max=msg.max,
        target=msg.target,
        hits=msg.hits,
        misses=msg.misses,
        hit_rate=msg.hit_rate,
        claim_rate=msg.claim_rate,
        refill_seconds=msg.refill_seconds,
        hinted=msg.hinted,
    )


def hint_request(template: str, count: int, within: float) -> pools_pb2.DemandHint:
    if not template:
        raise InvalidRequestError("template: a template name is required")
    if count < 1:
        raise InvalidRequestError(f"count: at least 1 (got {count})")
    if not math.isfinite(within) or within < 0:
        raise InvalidRequestError(f"within: seconds from now, 0 or more (got {within})")
    return pools_pb2.DemandHint(template=template, count=count, within_seconds=within)
