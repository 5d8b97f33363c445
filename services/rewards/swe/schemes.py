"""Reward schemes: how a grading outcome becomes a number.

- ``pm1``: +1 resolved, -1 otherwise (no patch, a patch that does not apply,
  a timeout, unresolved).
- ``binary``: +1 resolved, 0 otherwise.
- ``pass_rate``: ``f2p_weight * F2P rate + (1 - f2p_weight) * P2P rate``
  (default 0.3 / 0.7); 0 when there was nothing to grade.

An infrastructure failure has no reward at all (``None``): the sample should
be dropped, not scored.
"""

from __future__ import annotations

from enum import StrEnum


class RewardScheme(StrEnum):
    PM1 = "pm1"
    BINARY = "binary"
    PASS_RATE = "pass_rate"


DEFAULT_F2P_WEIGHT = 0.3


def reward_for(
    scheme: RewardScheme,
    *,
    graded: bool,
    resolved: bool,
    f2p_rate: float = 0.0,
    p2p_rate: float = 0.0,
    f2p_weight: float = DEFAULT_F2P_WEIGHT,
) -> float:
    if scheme is RewardScheme.PM1:
        return 1.0 if resolved else -1.0
    if scheme is RewardScheme.BINARY:
        return 1.0 if resolved else 0.0
    if not graded:
        return 0.0
    return f2p_weight * f2p_rate + (1.0 - f2p_weight) * p2p_rate
