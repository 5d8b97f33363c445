"""The local backend's work slots: creates are served before queued teardowns."""

from __future__ import annotations

import asyncio

import pytest
from orchard.scheduler.backends.local.slots import CREATE, TEARDOWN, PrioritySlots


async def _run(slots: PrioritySlots, name: str, priority: int, log: list[str]) -> None:
    async with slots.hold(priority):
        log.append(name)
        await asyncio.sleep(0.01)


def test_queued_create_goes_before_queued_teardowns() -> None:
    async def scenario() -> list[str]:
        slots, log = PrioritySlots(1), []
        blocker = asyncio.create_task(_run(slots, "first", TEARDOWN, log))
        await asyncio.sleep(0)
        tasks = [asyncio.create_task(_run(slots, f"t{n}", TEARDOWN, log)) for n in range(3)]
        await asyncio.sleep(0)
        tasks.append(asyncio.create_task(_run(slots, "create", CREATE, log)))
        await asyncio.gather(blocker, *tasks)
        return log

    assert asyncio.run(scenario()) == ["first", "create", "t0", "t1", "t2"]


def test_limit_holds_and_cancelled_waiters_give_their_turn_away() -> None:
    async def scenario() -> tuple[int, list[str]]:
        slots, log = PrioritySlots(2), []
        peak = 0
        inside = 0

        async def worker(name: str) -> None:
            nonlocal peak, inside
            async with slots.hold(CREATE):
                inside += 1
                peak = max(peak, inside)
                log.append(name)
                await asyncio.sleep(0.01)
                inside -= 1

        tasks = [asyncio.create_task(worker(f"w{n}")) for n in range(6)]
        await asyncio.sleep(0)
        tasks[3].cancel()  # waiting, never served
        results = await asyncio.gather(*tasks, return_exceptions=True)
        assert isinstance(results[3], asyncio.CancelledError)
        # All slots come back: a new holder gets one at once.
        await asyncio.wait_for(worker("after"), 1)
        return peak, log

    peak, log = asyncio.run(scenario())
    assert peak == 2
    assert log == ["w0", "w1", "w2", "w4", "w5", "after"]


def test_limit_must_be_positive() -> None:
    with pytest.raises(ValueError):
        PrioritySlots(0)
