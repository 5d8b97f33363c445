"""The shared revocation delivery (``scheduler/revocation_delivery.py``) against real gRPC
executors on unix sockets: a stand-in ExecutorService that verifies each notice with the
sandbox's own key (``TokenVerifier.for_sandbox``, what an injected executor holds) and can
be made slow or silent.

What is held: at most ``concurrency`` pushes at once; a slow executor costs its own
timeout, not the others' deliveries; a failure is retried on the next pass and, past
the give-up bound, reported overdue; what was acknowledged is not sent again; a
sandbox made after the moment is never sent anything.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
from orchard.executor.auth import CallAuthorizer
from orchard.scheduler.revocation_delivery import NoticeDelivery, NoticeTarget

from orchard._proto.orchard.v1 import executor_pb2 as pb
from orchard._proto.orchard.v1 import executor_pb2_grpc as pb_grpc
from orchard.common.errors import ServiceError
from orchard.common.tokens import TokenSigner, TokenVerifier

SIGNER = TokenSigner.from_key(b"n" * 32)
MOMENT = 2_000_000_000.0


SHARED = {"running": 0, "most": 0}
"""Revoke calls in progress over all the executors, and the most at once."""


class Executor(pb_grpc.ExecutorServiceServicer):
    """Revoke as an injected executor answers it (its ``CallAuthorizer.revoke`` over this
    sandbox's keys alone); ``delay`` makes it slow."""

    def __init__(self, sandbox_id: str, delay: float = 0.0) -> None:
        self.verifier = TokenVerifier.for_sandbox(sandbox_id, SIGNER.sandbox_keys_for(sandbox_id))
        self.authorizer = CallAuthorizer(self.verifier, clock=lambda: MOMENT)
        self.delay = delay
        self.calls = 0

    async def Revoke(
        self, request: pb.RevokeRequest, context: grpc.aio.ServicerContext
    ) -> pb.RevokeResponse:  # type: ignore[override]
        self.calls += 1
        SHARED["running"] += 1
        SHARED["most"] = max(SHARED["most"], SHARED["running"])
        try:
            await asyncio.sleep(self.delay)
            try:
                self.authorizer.revoke(request.sandbox_id, request.notice)
            except ServiceError as exc:
                await context.abort(exc.code, exc.message)
            return pb.RevokeResponse()
        finally:
            SHARED["running"] -= 1


@contextlib.asynccontextmanager
async def running(tmp_path: Path) -> AsyncIterator[dict[str, tuple[Executor, str]]]:
    """40 executors, each on its own unix socket, each holding only its sandbox's keys."""
    SHARED.update(running=0, most=0)
    servers = []
    made: dict[str, tuple[Executor, str]] = {}
    for i in range(40):
        sandbox_id = f"sb-deliver-{i:02d}"
        executor = Executor(sandbox_id, delay=0.05)
        server = grpc.aio.server()
        pb_grpc.add_ExecutorServiceServicer_to_server(executor, server)
        address = f"unix:{tmp_path}/{i}.sock"
        server.add_insecure_port(address)
        await server.start()
        servers.append(server)
        made[sandbox_id] = (executor, address)
    try:
        yield made
    finally:
        for server in servers:
            await server.stop(0)


def targets(
    made: dict[str, tuple[Executor, str]], created: float = MOMENT - 60
) -> list[NoticeTarget]:
    return [NoticeTarget(sid, "alice", address, created) for sid, (_, address) in made.items()]


def test_bounded_concurrency_and_nothing_sent_twice(tmp_path: Path) -> None:
    asyncio.run(_bounded_concurrency_and_nothing_sent_twice(tmp_path))


async def _bounded_concurrency_and_nothing_sent_twice(tmp_path: Path) -> None:
    async with running(tmp_path) as executors:
        delivery = NoticeDelivery(SIGNER, concurrency=8)
        table = {"alice": MOMENT - 1}
        first = await delivery.deliver(table, targets(executors))
        assert (first.delivered, first.failed) == (40, [])
        assert SHARED["most"] <= 8
        for executor, _ in executors.values():
            assert executor.verifier.revocations.revoked_before("alice") == MOMENT - 1
        again = await delivery.deliver(table, targets(executors))
        assert again.delivered == 0 and all(e.calls == 1 for e, _ in executors.values())
        # A later moment is sent again; a sandbox made after it never is.
        later = {"alice": MOMENT}
        newer = [
            NoticeTarget(t.sandbox_id, t.tenant, t.address, MOMENT + 1) for t in targets(executors)
        ]
        assert (await delivery.deliver(later, newer)).delivered == 0
        assert (await delivery.deliver(later, targets(executors))).delivered == 40


def test_a_silent_executor_is_retried_then_overdue(tmp_path: Path) -> None:
    asyncio.run(_a_silent_executor_is_retried_then_overdue(tmp_path))


async def _a_silent_executor_is_retried_then_overdue(tmp_path: Path) -> None:
    async with running(tmp_path) as executors:
        now = [0.0]
        delivery = NoticeDelivery(
            SIGNER, give_up_seconds=10.0, timeout_seconds=0.3, clock=lambda: now[0]
        )
        slow_id = "sb-deliver-00"
        executors[slow_id][0].delay = 5.0  # past the push timeout
        gone = NoticeTarget("sb-deliver-gone", "alice", f"unix:{tmp_path}/nothing.sock", 0.0)
        table = {"alice": MOMENT - 1}
        loop = asyncio.get_running_loop()
        started = loop.time()
        first = await delivery.deliver(table, [*targets(executors), gone])
        assert loop.time() - started < 3.0  # the silent one cost its own timeout only
        assert first.delivered == 39
        assert {t.sandbox_id for t in first.failed} == {slow_id, gone.sandbox_id}
        assert first.overdue == []
        now[0] = 11.0
        second = await delivery.deliver(table, [*targets(executors), gone])
        assert second.delivered == 0  # the 39 are not sent again
        assert {t.sandbox_id for t in second.overdue} == {slow_id, gone.sandbox_id}
        executors[slow_id][0].delay = 0.0
        third = await delivery.deliver(table, [*targets(executors), gone])
        assert third.delivered == 1 and [t.sandbox_id for t in third.failed] == [gone.sandbox_id]


def test_a_notice_for_the_wrong_sandbox_is_refused_by_the_executor(tmp_path: Path) -> None:
    """The delivery signs for the target's id: pointed at another sandbox's executor, the
    notice is refused there (and reported failed), nothing is revoked."""
    asyncio.run(_wrong_sandbox(tmp_path))


async def _wrong_sandbox(tmp_path: Path) -> None:
    async with running(tmp_path) as executors:
        delivery = NoticeDelivery(SIGNER)
        _, other_address = executors["sb-deliver-01"]
        wrong = NoticeTarget("sb-deliver-02", "alice", other_address, 0.0)
        result = await delivery.deliver({"alice": MOMENT - 1}, [wrong])
        assert result.failed == [wrong]
        assert executors["sb-deliver-01"][0].verifier.revocations.table() == {}
