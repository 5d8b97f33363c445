"""Warm pools from the client side: list them, and tell the scheduler what is coming.

    import orchard
    orchard.hint("py-small", 64, within=30)   # a batch of 64 claims within 30 s
    for pool in orchard.list_pools():
        print(pool.template, pool.ready, pool.target, pool.hit_rate)
    with orchard.Sandbox.create(template="py-small", env={"TASK": "42"}) as sb: ...

``async_hint`` / ``async_list_pools`` are the same calls for asyncio.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from orchard._proto.orchard.v1 import pools_pb2, pools_pb2_grpc

from ._channels import async_channel, sync_channel
from ._config import ClientConfig
from ._core import api_metadata, translate_errors
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


def list_pools(endpoint: str | None = None, api_key: str | None = None) -> list[PoolInfo]:
    """Every template's pool: sizes, target and hit rate."""
    config = ClientConfig.resolve(endpoint, api_key)
    stub = pools_pb2_grpc.PoolServiceStub(sync_channel(config.endpoint))
    with translate_errors():
        resp = stub.ListPools(pools_pb2.ListPoolsRequest(), metadata=api_metadata(config))
    return [pool_info(p) for p in resp.pools]


def hint(
    template: str,
    count: int,
    within: float = 0.0,
    endpoint: str | None = None,
    api_key: str | None = None,
) -> PoolInfo:
    """Tell the scheduler ``count`` sandboxes of ``template`` will be claimed within ``within`` s.

    The pool starts growing at once (up to its max), so the batch finds warm
    sandboxes. Returns the pool as it stands after the hint.
    """
    request = hint_request(template, count, within)
    config = ClientConfig.resolve(endpoint, api_key)
    stub = pools_pb2_grpc.PoolServiceStub(sync_channel(config.endpoint))
    with translate_errors():
        resp = stub.Hint(request, metadata=api_metadata(config))
    return pool_info(resp.pool)


async def async_list_pools(
    endpoint: str | None = None, api_key: str | None = None
) -> list[PoolInfo]:
    """:func:`list_pools` for asyncio."""
    config = ClientConfig.resolve(endpoint, api_key)
    stub = pools_pb2_grpc.PoolServiceStub(async_channel(config.endpoint))
    with translate_errors():
        resp = await stub.ListPools(pools_pb2.ListPoolsRequest(), metadata=api_metadata(config))  # type: ignore[misc]
    return [pool_info(p) for p in resp.pools]


async def async_hint(
    template: str,
    count: int,
    within: float = 0.0,
    endpoint: str | None = None,
    api_key: str | None = None,
) -> PoolInfo:
    """:func:`hint` for asyncio."""
    request = hint_request(template, count, within)
    config = ClientConfig.resolve(endpoint, api_key)
    stub = pools_pb2_grpc.PoolServiceStub(async_channel(config.endpoint))
    with translate_errors():
        resp = await stub.Hint(request, metadata=api_metadata(config))  # type: ignore[misc]
    return pool_info(resp.pool)
