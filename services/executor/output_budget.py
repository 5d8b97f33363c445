"""The executor's memory for command output, by fair share: refused, not grown.

Command output waits in the executor's memory: a Run keeps both streams
until the command ends, an Exec queues events until the client takes them,
a session keeps its command's output until the markers come. The per-call
cap alone (up to 256 MiB per stream) did not bound the total: three
concurrent calls of one 256 MiB sandbox grew the executor by 1.5 GiB,
uncharged to anyone.

Every byte held is now charged to its call's owner in one node-wide
:class:`OutputBudget` (a :class:`~.shares.ShareLedger` of bytes: per
sandbox, per tenant, per node). A call whose next chunk does not fit is
refused: its command is killed (tree) and the call ends with
RESOURCE_EXHAUSTED / QUOTA_EXCEEDED naming the full share. Why refused and
not spilled to a file inside the sandbox: the output would then sit in the
sandbox's writable layer, where the command itself can rewrite it before it
is read back (the result would no longer be evidence), and a disk-full
sandbox would fail differently from a memory-full one; a clear refusal keeps
one behaviour, and a caller that wants more output writes it to a file and
reads it with ReadFile (streamed, never held whole).

A kept byte is charged at its ``weight``: the copies it has by the time it
is sent. A buffered response (Run, SessionRun) has four (the kept chunks,
the joined bytes, the protobuf message, its serialization: measured, 100 MB
floods grew the executor by ~420 MB each); a streamed event has two (the
queued message and its serialization). What is not charged: a response gRPC
is still sending after the handler returned (measured in docs/benchmarks.md).

Memory is one share; the event loop's time is another. Reading output
costs the one loop every call shares (copies, frames), so an unbounded
flood of one tenant delays every other tenant's call (and the file
workers, which wait for the GIL the loop holds). :class:`OutputPace`
gives each tenant a byte rate of output reading (a token bucket with a
burst, so ordinary output never waits); a tenant past it has its pipes
left unread for a moment, and its commands block on a full pipe as they
would on a slow terminal.
"""

from __future__ import annotations

import asyncio
import time

from orchard.common.errors import ServiceError, quota_exceeded

from .shares import Owner, ShareLedger, ShareLimits

RETRY_AFTER_SECONDS = 1.0
BUFFERED_WEIGHT = 4
"""Copies of a byte of a buffered response (Run, SessionRun) before it is sent."""
STREAMED_WEIGHT = 2
"""Copies of a byte of a streamed Exec event before it is sent."""


class OutputPace:
    """Per-tenant token buckets of output bytes read per second (0 = unpaced)."""

    def __init__(self, bytes_per_second: float, burst_bytes: float) -> None:
        self._rate = bytes_per_second
        self._burst = burst_bytes
        self._buckets: dict[str, tuple[float, float]] = {}

    def _level(self, tenant: str, now: float) -> float:
        level, then = self._buckets.get(tenant, (self._burst, now))
        return min(self._burst, level + (now - then) * self._rate)

    def spend(self, tenant: str, size: int) -> None:
        if self._rate > 0 and size > 0:
            now = time.monotonic()
            self._buckets[tenant] = (self._level(tenant, now) - size, now)
            if len(self._buckets) > 4096:
                self._forget_full(now)

    def pause_seconds(self, tenant: str) -> float:
        """How long ``tenant``'s pipes should stay unread (0: read now)."""
        if self._rate <= 0 or tenant not in self._buckets:
            return 0.0
        level = self._level(tenant, time.monotonic())
        return 0.0 if level > 0 else -level / self._rate

    def _forget_full(self, now: float) -> None:
        for tenant in [t for t in self._buckets if self._level(t, now) >= self._burst]:
            del self._buckets[tenant]


class OutputBudget:
    """The node's ledger of held output bytes, and its pace of reading them."""

    def __init__(self, limits: ShareLimits, pace: OutputPace | None = None) -> None:
        self.ledger = ShareLedger(limits, "bytes of command output")
        self.pace = pace or OutputPace(0, 0)

    def charge(self, owner: Owner, weight: int = BUFFERED_WEIGHT) -> OutputCharge:
        return OutputCharge(self.ledger, owner, weight, self.pace)


class OutputCharge:
    """The output bytes one call holds; the first refusal is final for the call.

    ``refused`` is set (an asyncio.Event, so a waiter can stop the command at
    once) when a chunk did not fit; later chunks are refused too, so the
    call's output has no holes.
    """

    def __init__(
        self, ledger: ShareLedger, owner: Owner, weight: int, pace: OutputPace | None = None
    ) -> None:
        self._ledger = ledger
        self.owner = owner
        self._weight = weight
        self._pace = pace or OutputPace(0, 0)
        self.held = 0
        self.why: str | None = None
        self.refused = asyncio.Event()

    def take(self, size: int) -> bool:
        """Charge ``size`` more bytes; False (and ``refused``) when they do not fit."""
        if self.why is not None:
            return False
        if size <= 0:
            return True
        size *= self._weight
        if self._ledger.try_add(self.owner, size):
            self.held += size
            return True
        self.why = self._ledger.refusal(self.owner, size) or "the output budget is full"
        self.refused.set()
        return False

    def read(self, size: int) -> None:
        """``size`` bytes were read from the command (kept or not): the tenant's pace."""
        self._pace.spend(self.owner.tenant, size)

    def pause_seconds(self) -> float:
        return self._pace.pause_seconds(self.owner.tenant)

    def give_back(self, size: int) -> None:
        """Uncharge ``size`` kept bytes (sent to the client)."""
        size = min(size * self._weight, self.held)
        self._ledger.remove(self.owner, size)
        self.held -= size

    def close(self) -> None:
        self._ledger.remove(self.owner, self.held)
        self.held = 0

    def error(self) -> ServiceError:
        return quota_exceeded(
            f"the command's output does not fit in the executor's memory: {self.why}; "
            "the command was killed (write large output to a file and read it with ReadFile)",
            retry_after=RETRY_AFTER_SECONDS,
        )

    def __enter__(self) -> OutputCharge:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
