"""LogThrottle keeps a flood of one cause to a few lines, says what it dropped, and forgets
old causes instead of growing."""

from __future__ import annotations

from orchard.common import log_throttle
from orchard.common.log_throttle import LogThrottle


def test_a_flood_of_one_cause_is_a_few_lines_and_counts_the_rest() -> None:
    now = [0.0]
    throttle = LogThrottle(every_seconds=60, burst=3, clock=lambda: now[0])
    allowed = [throttle.allow(("sni", "sb-1")) for _ in range(10_000)]
    assert [a for a in allowed if a is not None] == [0, 0, 0]
    assert throttle.allow(("sni", "sb-2")) == 0  # another cause is not held back
    now[0] = 61.0
    assert throttle.allow(("sni", "sb-1")) == 9_997  # one line, saying what it left out
    assert throttle.allow(("sni", "sb-1")) is None


def test_the_table_of_causes_is_bounded(monkeypatch: object) -> None:
    throttle = LogThrottle()
    for i in range(log_throttle.MAX_CAUSES * 3):
        throttle.allow(i)
    assert len(throttle._causes) == log_throttle.MAX_CAUSES
