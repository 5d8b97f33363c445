"""Bounds on client request streams: idle time and tiny messages.

A client stream costs the executor an open call and, per message, Python
work on its one event loop. Two hostile shapes are bounded here:

- **Idle**: a stream that sends nothing for ``idle_seconds`` (before its
  first message, or between WriteFile/Upload chunks) ends with
  DEADLINE_EXCEEDED, so a forgotten or malicious half-open stream does not
  hold its file, its temporary folder and its call forever.
- **Tiny messages**: 200,000 one-byte chunks on one stream slowed another
  sandbox's exec 6x (every message is taken on the shared loop). Past the
  first :data:`FREE_SMALL_MESSAGES` of a stream, messages under
  :data:`SMALL_MESSAGE_BYTES` are paced to ``per_second`` per stream (the
  stream waits, in steps, and gRPC flow control pushes back on the sender),
  and a WriteFile/Upload stream sending more than ``max_per_stream`` of them
  is refused with RESOURCE_EXHAUSTED. An Exec's stdin is paced, never
  refused (keystrokes are small). Real file clients send 64-256 KiB chunks
  and are never slowed. What pacing cannot remove is gRPC's own work taking
  frames off the socket (measured in docs/reliability.md).
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
PACE_STEP_SECONDS = 0.02


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


@dataclass(frozen=True)
class SmallMessageLimits:
    """The pace and the cap for messages under SMALL_MESSAGE_BYTES (per stream)."""

    per_second: float = 1000.0
    """0 or less: unpaced."""
    max_per_stream: int = 16384
    """For file streams; 0 or less: no cap."""


class StreamPace:
    """One stream's small messages: paced (a leaky bucket, slept in steps) and counted."""

    def __init__(self, limits: SmallMessageLimits, what: str, capped: bool = True) -> None:
        self._limits = limits
        self._what = what
        self._capped = capped and limits.max_per_stream > 0
        self._next_slot = 0.0
        self.small = 0

    async def account(self, size: int) -> None:
        if size >= SMALL_MESSAGE_BYTES:
            return
        self.small += 1
        if self.small <= FREE_SMALL_MESSAGES:
            return
        if self._capped and self.small > self._limits.max_per_stream:
            raise ServiceError(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                "TOO_MANY_SMALL_MESSAGES",
                f"the {self._what} stream sent more than {self._limits.max_per_stream} messages "
                f"under {SMALL_MESSAGE_BYTES} bytes; send larger chunks (64 KiB or more)",
            )
        if self._limits.per_second <= 0:
            return
        now = time.monotonic()
        self._next_slot = max(now, self._next_slot) + 1.0 / self._limits.per_second
        ahead = self._next_slot - now
        # Sleep in steps of PACE_STEP_SECONDS, not per message: a timer per tiny message
        # would itself cost the loop what the pacing saves.
        if ahead >= PACE_STEP_SECONDS:
            await asyncio.sleep(ahead)
