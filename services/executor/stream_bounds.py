"""Bounds on client request streams: idle time and tiny messages.

A client stream costs the executor an open call and, per message, Python
work on its one event loop. Two hostile shapes are bounded here:

- **Idle**: a stream that sends nothing for ``idle_seconds`` (before its
  first message, or between WriteFile/Upload chunks) ends with
  DEADLINE_EXCEEDED, so a forgotten or malicious half-open stream does not
  hold its file, its temporary folder and its call forever.
- **Tiny messages**: 200,000 one-byte chunks on one stream slowed another
  sandbox's exec 6x (every message is parsed on the shared loop). Messages
  below :data:`SMALL_MESSAGE_BYTES` after the first
  :data:`FREE_SMALL_MESSAGES` of a stream draw from one executor-wide budget
  of ``small_per_second``, so tiny-chunk streams are slowed (gRPC flow control
  pushes back on the sender) instead of taking the loop; and a stream that
  sends more than ``max_small`` of them is refused with RESOURCE_EXHAUSTED.
  Real clients send 64-256 KiB chunks and are never slowed.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import TypeVar

import grpc

from orchard.common.errors import ServiceError

T = TypeVar("T")

SMALL_MESSAGE_BYTES = 4096
FREE_SMALL_MESSAGES = 64


def idle_error(seconds: float, what: str) -> ServiceError:
    return ServiceError(
        grpc.StatusCode.DEADLINE_EXCEEDED,
        "STREAM_IDLE",
        f"the {what} stream sent nothing for {seconds:g} s; it was ended",
    )


async def next_or_idle(requests: AsyncIterator[T], seconds: float, what: str) -> T | None:
    """The next message, None at the end; DEADLINE_EXCEEDED after ``seconds`` of silence."""
    try:
        async with asyncio.timeout(seconds):  # a timer handle, no task per message
            return await anext(requests, None)
    except TimeoutError:
        raise idle_error(seconds, what) from None


@dataclass
class SmallMessageBudget:
    """One executor-wide pace for small messages (a leaky bucket: one slot per
    ``1 / per_second`` seconds), and the per-stream cap."""

    per_second: float = 2000.0
    max_per_stream: int = 65536
    _next_slot: float = 0.0

    async def pace(self) -> None:
        """Wait for this small message's slot."""
        now = time.monotonic()
        slot = max(now, self._next_slot)
        self._next_slot = slot + 1.0 / self.per_second
        if slot > now:
            await asyncio.sleep(slot - now)


class StreamPace:
    """Counts one stream's small messages against the shared budget."""

    def __init__(self, budget: SmallMessageBudget, what: str) -> None:
        self._budget = budget
        self._what = what
        self.small = 0

    async def account(self, size: int) -> None:
        if size >= SMALL_MESSAGE_BYTES:
            return
        self.small += 1
        if self.small <= FREE_SMALL_MESSAGES:
            return
        if self.small > self._budget.max_per_stream:
            raise ServiceError(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                "TOO_MANY_SMALL_MESSAGES",
                f"the {self._what} stream sent more than {self._budget.max_per_stream} messages "
                f"under {SMALL_MESSAGE_BYTES} bytes; send larger chunks (64 KiB or more)",
            )
        await self._budget.pace()
