"""The admission pieces alone: fair queue order, token bucket, quota parsing, SDK wait schedule."""

from __future__ import annotations

import asyncio

import pytest
from orchard.gateway.admission import FairCreateQueue, RateLimiter

from orchard.client._errors import QuotaExceededError
from orchard.client._quota_wait import QuotaWait
from orchard.common.quotas import Quota, QuotaConfigError, QuotaTable


def test_fair_queue_serves_waiting_tenants_round_robin() -> None:
    async def scenario() -> list[str]:
        queue = FairCreateQueue(slots=1)
        order: list[str] = []
        gate = asyncio.Event()

        async def one(tenant: str) -> None:
            async with queue.slot(tenant):
                order.append(tenant)
                await gate.wait()

        tasks = [asyncio.create_task(one("noisy")) for _ in range(6)]
        await asyncio.sleep(0)
        tasks += [asyncio.create_task(one("quiet")) for _ in range(2)]
        await asyncio.sleep(0)
        gate.set()
        await asyncio.gather(*tasks)
        assert queue.busy == 0 and queue.waiting() == {}
        return order

    order = asyncio.run(scenario())
    assert order[:5] == ["noisy", "quiet", "noisy", "quiet", "noisy"]


def test_a_cancelled_waiter_gives_its_turn_away() -> None:
    async def scenario() -> int:
        queue = FairCreateQueue(slots=1)
        release = asyncio.Event()

        async def hold() -> None:
            async with queue.slot("a"):
                await release.wait()

        holder = asyncio.create_task(hold())
        await asyncio.sleep(0)
        waiter = asyncio.create_task(hold())
        await asyncio.sleep(0)
        waiter.cancel()
        release.set()
        await holder
        with pytest.raises(asyncio.CancelledError):
            await waiter
        busy: int = queue.busy
        return busy

    assert asyncio.run(scenario()) == 0


def test_token_bucket_refills_at_the_rate_and_says_when() -> None:
    now = [100.0]
    limiter = RateLimiter(clock=lambda: now[0])
    quota = Quota(create_rate=2, create_burst=2)
    assert limiter.take("t", quota) is None and limiter.take("t", quota) is None
    refused = limiter.take("t", quota)
    assert refused is not None and refused.retry_after == pytest.approx(0.5)
    assert dict(refused.trailing_metadata())["retry-after"] == "0.500"
    now[0] += 0.5
    assert limiter.take("t", quota) is None
    assert limiter.take("other", quota) is None  # buckets are per tenant
    assert limiter.take("t", Quota()) is None  # no rate: unlimited


def test_quota_file_and_metadata_are_strict() -> None:
    table = QuotaTable.parse(
        '{"default": {"max_sandboxes": 5}, "tenants": {"a": {"max_execs": 2}}}'
    )
    assert table.for_tenant("a") == Quota(max_sandboxes=5, max_execs=2)
    assert table.for_tenant("zzz") == Quota(max_sandboxes=5)
    assert Quota.from_metadata(table.for_tenant("a").to_metadata()) == table.for_tenant("a")
    for bad in (
        '{"tenants": {"a": {"max_sandbox": 1}}}',
        '{"default": {"max_execs": -1}}',
        '{"default": {"create_rate": "NaN"}}',
        '{"default": {"max_execs": true}}',
        "[1]",
        '{"extra": 1}',
    ):
        with pytest.raises(QuotaConfigError):
            QuotaTable.parse(bad)
    with pytest.raises(QuotaConfigError):
        Quota.from_metadata("max_execs")


def test_sdk_wait_honours_retry_after_and_its_budget() -> None:
    now = [0.0]
    wait = QuotaWait(2.0, clock=lambda: now[0], rand=lambda: 0.0)
    assert wait.next_delay(QuotaExceededError("x", retry_after=0.7)) == pytest.approx(0.7)
    assert wait.next_delay(QuotaExceededError("x")) == pytest.approx(0.1)
    assert wait.next_delay(QuotaExceededError("x")) == pytest.approx(0.2)
    now[0] = 1.9
    assert wait.next_delay(QuotaExceededError("x", retry_after=0.5)) is None
    assert QuotaWait(0).next_delay(QuotaExceededError("x", retry_after=0.1)) is None
