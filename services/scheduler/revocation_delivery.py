"""Telling a sandbox's own executor that a tenant's older tokens are void.

An executor that runs inside its sandbox (a Kubernetes pod's, a local injected
or runsc sandbox's) checks tokens with the sandbox's own keys and has no
``revocations.json``: it hears of a revocation only through a **notice**
(``ExecutorService.Revoke``), signed with that sandbox's key
(``TokenSigner.sign_revocation``), which it verifies and remembers. Both places
that know such sandboxes use this one delivery: the Kubernetes backend
(``backends/kubernetes/revocation_push.py``, its targets from the pod cache)
and the scheduler for the local backend (``revocations.py``, its targets from
the store), and the scheduler's key-drop notices (``key_drops.py``: the same
delivery with another notice, ``TokenSigner.sign_key_drop``, whose subject is a
dropped key id instead of a tenant).

What a delivery guarantees:

- a notice is sent to each target whose tokens can predate the moment (tokens
  of a sandbox are all issued after its ``created``), until its executor has
  acknowledged that moment or a later one; notices only add revocations, so
  sending one twice is harmless;
- at most :data:`MAX_CONCURRENT_PUSHES` at once, each bounded by
  :data:`PUSH_TIMEOUT_SECONDS`, so a stuck executor holds one slot, not the pass;
- a failure is logged and retried on the next pass; a target that has failed
  for longer than the give-up bound is reported *overdue*, for the caller to
  act on (the local scheduler deletes the sandbox rather than leave it to serve
  the revoked tokens).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field

import grpc
import structlog

from orchard._proto.orchard.v1 import executor_pb2, executor_pb2_grpc
from orchard.common.tokens import TokenError, TokenSigner

log = structlog.get_logger("orchard.scheduler.revocations")

PUSH_TIMEOUT_SECONDS = 3.0
MAX_CONCURRENT_PUSHES = 32


@dataclass(frozen=True)
class NoticeTarget:
    """One sandbox whose own executor must hear of its tenant's revocation."""

    sandbox_id: str
    tenant: str
    """What the notice is about: the tenant (a revocation) or the dropped key id (a key
    drop); it keys the table of moments handed to :meth:`NoticeDelivery.deliver`."""
    address: str
    """A gRPC target: ``host:port`` (a pod) or ``unix:<path>`` (a local sandbox's socket)."""
    created: float
    """Unix seconds; every token of the sandbox is issued after it, and it picks the key
    the tokens (and so the notice) are signed with (``Keyring.kid_for``)."""


@dataclass
class PassResult:
    """What one :meth:`NoticeDelivery.deliver` did."""

    delivered: int = 0
    failed: list[NoticeTarget] = field(default_factory=list)
    overdue: list[NoticeTarget] = field(default_factory=list)
    """Failed, and failing for longer than the give-up bound."""


class NoticeDelivery:
    """Sends each target the notice it still lacks; remembers what was acknowledged."""

    def __init__(
        self,
        signer: TokenSigner,
        *,
        give_up_seconds: float | None = None,
        timeout_seconds: float = PUSH_TIMEOUT_SECONDS,
        concurrency: int = MAX_CONCURRENT_PUSHES,
        clock: Callable[[], float] = time.monotonic,
        sign: Callable[[NoticeTarget, float], str] | None = None,
        what: str = "revocation",
    ) -> None:
        self._signer = signer
        self._sign = sign or self._sign_revocation
        """(target, moment) -> the notice; TokenError/KeyError if it cannot be signed now."""
        self._what = what
        self._give_up = give_up_seconds
        self._timeout = timeout_seconds
        self._concurrency = concurrency
        self._clock = clock
        self._delivered: dict[tuple[str, str], float] = {}
        """(sandbox id, tenant) -> the moment its executor has acknowledged."""
        self._failing_since: dict[tuple[str, str], float] = {}
        self.pushed = 0
        """Notices acknowledged (visible to tests and metrics)."""

    def due(
        self, table: Mapping[str, float], targets: Iterable[NoticeTarget]
    ) -> list[NoticeTarget]:
        """The targets whose executor may still take tokens its tenant's moment voids."""
        out = []
        for target in targets:
            before = table.get(target.tenant)
            if before is None or before <= target.created:
                continue  # no revocation, or every token of the sandbox is issued after it
            if self._delivered.get((target.sandbox_id, target.tenant), 0.0) >= before:
                continue
            out.append(target)
        return out

    def forget(self, keep: Callable[[str, str], bool]) -> None:
        """Drop what is remembered of (sandbox id, tenant) pairs ``keep`` refuses (a sandbox
        that is gone, a tenant the caller will not ask about again until it changes)."""
        for remembered in (self._delivered, self._failing_since):
            for key in [k for k in remembered if not keep(*k)]:
                del remembered[key]

    async def deliver(
        self, table: Mapping[str, float], targets: Iterable[NoticeTarget]
    ) -> PassResult:
        """Push every due notice (bounded concurrency); returns what happened."""
        due = self.due(table, targets)
        result = PassResult()
        if not due:
            return result
        gate = asyncio.Semaphore(self._concurrency)

        async def bounded(target: NoticeTarget) -> bool:
            async with gate:
                return await self._push(target, table[target.tenant])

        outcomes = await asyncio.gather(*(bounded(t) for t in due))
        now = self._clock()
        for target, ok in zip(due, outcomes, strict=True):
            key = (target.sandbox_id, target.tenant)
            if ok:
                result.delivered += 1
                self._failing_since.pop(key, None)
                continue
            result.failed.append(target)
            since = self._failing_since.setdefault(key, now)
            if self._give_up is not None and now - since >= self._give_up:
                result.overdue.append(target)
        self.pushed += result.delivered
        return result

    def _sign_revocation(self, target: NoticeTarget, before: float) -> str:
        return self._signer.sign_revocation(
            target.sandbox_id, target.tenant, before, created=target.created
        )

    async def _push(self, target: NoticeTarget, before: float) -> bool:
        try:
            notice = self._sign(target, before)
        except (TokenError, KeyError) as exc:  # a keyring that cannot be read right now
            log.warning(f"{self._what} notice not signed", sandbox_id=target.sandbox_id,
                        error=str(exc))  # fmt: skip
            return False
        try:
            async with grpc.aio.insecure_channel(target.address) as channel:
                stub = executor_pb2_grpc.ExecutorServiceStub(channel)
                await stub.Revoke(
                    executor_pb2.RevokeRequest(sandbox_id=target.sandbox_id, notice=notice),
                    timeout=self._timeout,
                )
        except grpc.aio.AioRpcError as exc:
            log.warning(
                f"{self._what} not delivered yet; retrying",
                sandbox_id=target.sandbox_id,
                about=target.tenant,
                code=exc.code().name,
                details=exc.details(),
            )
            return False
        self._delivered[(target.sandbox_id, target.tenant)] = before
        log.info(f"{self._what} delivered", sandbox_id=target.sandbox_id, about=target.tenant,
                 before=before)  # fmt: skip
        return True


class PassLoop:
    """Runs ``one_pass`` every ``interval`` seconds in a task; one failing pass is logged and
    never ends the deliveries."""

    def __init__(
        self, name: str, one_pass: Callable[[], Awaitable[object]], interval: float
    ) -> None:
        self._name = name
        self._pass = one_pass
        self._interval = interval
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name=self._name)

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def _run(self) -> None:
        while True:
            try:
                await self._pass()
            except Exception as exc:  # never let one bad pass end the deliveries
                log.warning("revocation pass failed; retrying", loop=self._name, error=str(exc))
            await asyncio.sleep(self._interval)
