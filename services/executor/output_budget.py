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
reads it with ReadFile (streamed, never held whole). What is not charged:
gRPC's own copy of a response being sent, which lasts as long as the client
takes to read it (measured in docs/benchmarks.md).
"""

from __future__ import annotations

import asyncio

from orchard.common.errors import ServiceError, quota_exceeded

from .shares import Owner, ShareLedger, ShareLimits

RETRY_AFTER_SECONDS = 1.0


class OutputBudget:
    """The node's ledger of held output bytes."""

    def __init__(self, limits: ShareLimits) -> None:
        self.ledger = ShareLedger(limits, "bytes of command output")

    def charge(self, owner: Owner) -> OutputCharge:
        return OutputCharge(self.ledger, owner)


class OutputCharge:
    """The output bytes one call holds; the first refusal is final for the call.

    ``refused`` is set (an asyncio.Event, so a waiter can stop the command at
    once) when a chunk did not fit; later chunks are refused too, so the
    call's output has no holes.
    """

    def __init__(self, ledger: ShareLedger, owner: Owner) -> None:
        self._ledger = ledger
        self.owner = owner
        self.held = 0
        self.why: str | None = None
        self.refused = asyncio.Event()

    def take(self, size: int) -> bool:
        """Charge ``size`` more bytes; False (and ``refused``) when they do not fit."""
        if self.why is not None:
            return False
        if size <= 0:
            return True
        if self._ledger.try_add(self.owner, size):
            self.held += size
            return True
        self.why = self._ledger.refusal(self.owner, size) or "the output budget is full"
        self.refused.set()
        return False

    def give_back(self, size: int) -> None:
        size = min(size, self.held)
        self._ledger.remove(self.owner, size)
        self.held -= size

    def close(self) -> None:
        self.give_back(self.held)

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
