"""Which integrity findings take a run's reward away: a per-dataset setting.

A dataset states it in each row as ``reward_policy`` (top level or under
``metadata``): ``{"zero_reward_on": ["high", "test_infrastructure_modified", ...]}``,
a list of severities (``high``, ``medium``, ``low``: that severity) and rule
names (that rule at any severity). Default: ``["high"]``.

"Zero" here means *no positive reward*: the run counts as not resolved and
gets the scheme's reward for an unresolved run (``pm1``: -1, ``binary``: 0,
``pass_rate``: 0). A literal 0 under ``pm1`` would pay a hack better than an
honest failure. A forged or incomplete log is never graded at all
(``invalid_log``), whatever the policy.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from .diff_gate import SEVERITIES, Finding

DEFAULT_ZERO_ON = frozenset({"high"})


class PolicyError(ValueError):
    """The row's ``reward_policy`` is malformed; the message names the field."""


@dataclass(frozen=True)
class RewardPolicy:
    zero_reward_on: frozenset[str] = DEFAULT_ZERO_ON

    def zeroes(self, finding: Finding) -> bool:
        return finding.severity in self.zero_reward_on or finding.rule in self.zero_reward_on

    def zeroing(self, findings: Iterable[Finding]) -> list[Finding]:
        return [f for f in findings if self.zeroes(f)]


def parse_policy(value: Any) -> RewardPolicy:
    if value is None or value == "" or value == {}:
        return RewardPolicy()
    if not isinstance(value, Mapping) or set(value) - {"zero_reward_on"}:
        raise PolicyError('reward_policy: must be {"zero_reward_on": [severity or rule, ...]}')
    items = value.get("zero_reward_on", sorted(DEFAULT_ZERO_ON))
    if not isinstance(items, list) or not all(isinstance(i, str) and i for i in items):
        raise PolicyError(
            "reward_policy.zero_reward_on: must be a list of severities or rule names"
        )
    for item in items:
        if item.islower() and item in SEVERITIES:
            continue
        if not all(c.islower() or c == "_" for c in item):
            raise PolicyError(
                f"reward_policy.zero_reward_on: {item!r} is not a severity or rule name"
            )
    return RewardPolicy(frozenset(items))
