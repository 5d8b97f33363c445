"""The pure parts of fault handling: when ``orchard up`` gives up restarting, what counts as
a full disk. (The behaviour under real faults is in test_faults.py.)"""

from __future__ import annotations

import errno
import sqlite3

import grpc
import pytest
from orchard.scheduler.backends.base import BackendError
from orchard.scheduler.disk_full import disk_full_error, is_disk_full, says_disk_full

from orchard.cli._supervision import RestartPolicy

pytestmark = pytest.mark.reliability


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_restart_delays_double_then_a_crash_loop_gives_up() -> None:
    clock = Clock()
    policy = RestartPolicy(max_crashes=5, window_seconds=60, first_delay_seconds=0.2, clock=clock)
    delays = []
    for _ in range(4):
        delays.append(policy.crashed())
        clock.now += 1
    assert delays == [0.2, 0.4, 0.8, 1.6]
    assert policy.crashed() is None  # the fifth crash within a minute


def test_crashes_older_than_the_window_are_forgotten() -> None:
    clock = Clock()
    policy = RestartPolicy(max_crashes=3, window_seconds=10, first_delay_seconds=1, clock=clock)
    for _ in range(10):
        assert policy.crashed() == 1.0  # one crash every 11 s never adds up to a loop
        clock.now += 11


def test_the_delay_is_capped() -> None:
    clock = Clock()
    policy = RestartPolicy(max_crashes=100, max_delay_seconds=8, clock=clock)
    assert max(policy.crashed() or 0 for _ in range(20)) == 8


def test_disk_full_is_recognised_through_causes_and_messages() -> None:
    enospc = OSError(errno.ENOSPC, "No space left on device")
    assert is_disk_full(enospc)
    assert is_disk_full(sqlite3.OperationalError("database or disk is full"))
    try:
        try:
            raise enospc
        except OSError as err:
            raise BackendError.failure(f"create sb-x: {err}") from err
    except BackendError as wrapped:
        assert is_disk_full(wrapped)
    assert says_disk_full("runc create failed: write /x: no space left on device")
    assert not is_disk_full(OSError(errno.EACCES, "Permission denied"))
    assert not is_disk_full(sqlite3.OperationalError("database is locked"))
    assert not says_disk_full("image not found")


def test_disk_full_error_is_resource_exhausted_with_a_message_that_says_so() -> None:
    error = disk_full_error("database or disk is full")
    assert error.code == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert error.reason == "DISK_FULL"
    assert error.fault == "infrastructure"
    assert "full" in error.message and "free space" in error.message
