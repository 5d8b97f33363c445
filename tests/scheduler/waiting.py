"""Polling with a deadline (the pool filler works in the background)."""

from __future__ import annotations

import time
from collections.abc import Callable


def wait_for(condition: Callable[[], bool], timeout: float = 10.0, what: str = "") -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what or condition}")
        time.sleep(0.02)
