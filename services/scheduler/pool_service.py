"""The scheduler's PoolService servicer: list pools, take demand hints (internal; the gateway forwards).

Pools are shared by every tenant (templates are the operator's), so any
authenticated tenant may list them and hint; a hint only makes the pool grow
within the template's ``max``, asks for no more than the tenant's
``max_sandboxes``, and replaces the tenant's previous hint for that pool (one
live hint per tenant and pool, so hints cannot pile up).
"""

from __future__ import annotations

import math

from orchard._proto.orchard.v1 import pools_pb2, pools_pb2_grpc
from orchard.common.errors import invalid

from .pool_filler import PoolFiller
from .pools import WarmPool
from .service import Context, tenant_of
from .tenant_quota import call_quota

# A hint further ahead than this is more likely a unit mix-up (ms for s) than a plan.
MAX_HINT_AHEAD_SECONDS = 24 * 3600


def pool_status(pool: WarmPool) -> pools_pb2.PoolStatus:
    return pools_pb2.PoolStatus(
        template=pool.template.to_proto(),
        ready=pool.counts.ready,
        pending=pool.counts.pending,
        claimed=pool.counts.claimed,
        min=pool.template.min,
        max=pool.template.max,
        target=pool.target(),
        hits=pool.hits,
        misses=pool.misses,
        hit_rate=pool.hit_rate,
        claim_rate=pool.claim_rate,
        refill_seconds=pool.refill_seconds,
        hinted=pool.hinted,
        created=pool.created,
        create_failures=pool.create_failures,
    )


class PoolServicer(pools_pb2_grpc.PoolServiceServicer):
    def __init__(self, pools: PoolFiller) -> None:
        self.pools = pools

    async def ListPools(
        self, request: pools_pb2.ListPoolsRequest, context: Context
    ) -> pools_pb2.ListPoolsResponse:
        tenant_of(context)
        return pools_pb2.ListPoolsResponse(
            pools=[pool_status(p) for p in self.pools.pools.values()]
        )

    async def Hint(self, request: pools_pb2.DemandHint, context: Context) -> pools_pb2.HintResponse:
        tenant = tenant_of(context)
        if not request.template:
            raise invalid("template: a template name is required")
        pool = self.pools.pool(request.template)
        if not 1 <= request.count <= max(1, pool.template.max):
            raise invalid(
                f"count must be between 1 and the pool's max ({pool.template.max}); got {request.count}"
            )
        quota = call_quota().max_sandboxes
        if quota and request.count > quota:
            raise invalid(
                f"count {request.count} is more than tenant {tenant!r} may hold "
                f"(max_sandboxes {quota})"
            )
        within = request.within_seconds
        if not math.isfinite(within) or not 0 <= within <= MAX_HINT_AHEAD_SECONDS:
            raise invalid(
                f"within_seconds must be between 0 and {MAX_HINT_AHEAD_SECONDS}; got {within}"
            )
        self.pools.hint(request.template, request.count, within, tenant)
        return pools_pb2.HintResponse(pool=pool_status(pool))
