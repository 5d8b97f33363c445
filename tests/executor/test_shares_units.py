"""Unit tests of the executor's fair shares: the ledger, the file workers' admission, the output pace."""

from __future__ import annotations

import asyncio
import threading

import pytest
from orchard.executor.exec_quota import CALL_CLAIMS
from orchard.executor.files.bridge import TransferWorkers
from orchard.executor.output_budget import OutputBudget, OutputPace
from orchard.executor.shares import Owner, ShareLedger, ShareLimits

from orchard.common.errors import ServiceError
from orchard.common.tokens import TokenClaims

A1 = Owner("a", "sb-a1")
A2 = Owner("a", "sb-a2")
B1 = Owner("b", "sb-b1")


def test_ledger_refuses_past_each_share_and_names_it() -> None:
    ledger = ShareLedger(ShareLimits(per_sandbox=2, per_tenant=3, node=4), "things")
    assert ledger.try_add(A1, 2)
    assert "sandbox sb-a1" in (ledger.refusal(A1, 1) or "")
    assert ledger.try_add(A2, 1)
    assert "tenant 'a'" in (ledger.refusal(A2, 1) or "")
    assert ledger.try_add(B1, 1)
    assert ledger.refusal(B1, 1) is not None and "node" in (ledger.refusal(B1, 1) or "")
    ledger.remove(A1, 2)
    assert ledger.held(A1) == 0 and ledger.tenant_held("a") == 1 and ledger.total == 2
    assert ledger.refusal(B1, 1) is None


def _as(owner: Owner) -> None:
    CALL_CLAIMS.set(TokenClaims(owner.sandbox, owner.tenant, 0, 0))


def test_file_workers_leave_room_for_another_tenant_and_refuse_after_the_wait() -> None:
    async def scenario() -> None:
        workers = TransferWorkers(ShareLimits(per_sandbox=2, per_tenant=2, node=4), 0.2)
        release = threading.Event()

        async def hold(owner: Owner) -> None:
            _as(owner)
            await (await workers.run(release.wait, 5))

        held = [asyncio.create_task(hold(A1)) for _ in range(2)]
        await asyncio.sleep(0.05)
        over = asyncio.create_task(hold(A2))  # tenant a's share is full: waits, then refused
        _as(B1)
        assert await (await workers.run(lambda: "b ran")) == "b ran"
        with pytest.raises(ServiceError) as refused:
            await over
        assert refused.value.reason == "QUOTA_EXCEEDED" and "tenant 'a'" in str(refused.value)
        release.set()
        await asyncio.gather(*held)
        assert workers.ledger.total == 0

    asyncio.run(scenario())


def test_a_waiting_transfer_gets_the_first_worker_its_share_frees() -> None:
    async def scenario() -> None:
        workers = TransferWorkers(ShareLimits(per_sandbox=1, per_tenant=1, node=2), 5)
        release = threading.Event()
        _as(A1)
        first = await workers.run(release.wait, 5)
        waiting = asyncio.create_task(workers.run(lambda: "second"))
        await asyncio.sleep(0.05)
        assert not waiting.done()
        release.set()
        await first
        assert await (await waiting) == "second"

    asyncio.run(scenario())


def test_output_charge_refuses_past_the_share_and_gives_back_on_close() -> None:
    async def scenario() -> None:
        budget = OutputBudget(ShareLimits(per_sandbox=100, per_tenant=100, node=100))
        with budget.charge(A1, weight=4) as charge:
            assert charge.take(25)
            assert not charge.take(1) and charge.refused.is_set()
            assert "sandbox sb-a1" in (charge.why or "")
        assert budget.ledger.total == 0

    asyncio.run(scenario())


def test_output_pace_pauses_a_tenant_past_its_burst_only() -> None:
    pace = OutputPace(bytes_per_second=1000, burst_bytes=500)
    pace.spend("a", 400)
    assert pace.pause_seconds("a") == 0
    pace.spend("a", 600)
    assert 0.05 < pace.pause_seconds("a") <= 0.5
    assert pace.pause_seconds("b") == 0
