"""BAR against plain GRPO at an equal rollout budget, over a task-difficulty distribution.

    python -m orchard.recipes.swe.bar_simulation [--budget 8000] [--seeds 0 1 2] [--abort-rate 0.03]

Each task has a true solve probability drawn from a mixture shaped like an SWE training set
for a mid-size policy (many never solved, some always solved, a spread between); every
rollout succeeds with that probability, or is aborted (infrastructure) with ``abort-rate``.
Both samplers draw tasks from the same stream until the budget is spent (a task is started
only when its worst case fits). A group is *useful* when its graded rewards differ (non-zero
variance: GRPO gets a gradient from it). Printed as JSON: per sampler, groups returned to the
trainer, useful groups, their share, rollouts spent, rollouts per useful group, samples the
trainer is fed, and the mean reward standard deviation of the useful groups (pm1 rewards:
1.0 for a 2/2 split, 0.87 for 1/3), the mean over seeds.

The draws go through :func:`orchard.recipes.swe.bar.sample_group` itself (a coroutine that
answers at once), so the figure is the sampler's own behaviour, not a re-implementation.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from orchard.rollouts import RolloutResult, Status, Task

from .bar import BarConfig, sample_group

# (weight, sampler of the solve probability)
MIXTURE: list[tuple[float, Callable[[random.Random], float]]] = [
    (0.35, lambda r: 0.0),  # never solved
    (0.15, lambda r: r.betavariate(0.5, 4.0)),  # hard
    (0.20, lambda r: r.betavariate(2.0, 2.0)),  # in reach
    (0.15, lambda r: r.betavariate(4.0, 0.5)),  # easy
    (0.15, lambda r: 1.0),  # always solved
]


def difficulty(rng: random.Random) -> float:
    x, acc = rng.random(), 0.0
    for weight, draw in MIXTURE:
        acc += weight
        if x < acc:
            return draw(rng)
    return MIXTURE[-1][1](rng)


@dataclass
class Tally:
    groups: int = 0
    useful: int = 0
    spent: int = 0
    tasks: int = 0
    samples: int = 0
    std_sum: float = 0.0

    def add(self, rewards: list[float | None]) -> None:
        graded = [r for r in rewards if r is not None]
        self.groups += 1
        self.samples += len(rewards)
        if len(set(graded)) > 1:
            self.useful += 1
            mean = sum(graded) / len(graded)
            self.std_sum += (sum((r - mean) ** 2 for r in graded) / len(graded)) ** 0.5

    def report(self) -> dict[str, float | None]:
        return {
            "tasks": self.tasks, "groups": self.groups, "useful_groups": self.useful,
            "useful_share": round(self.useful / self.groups, 4) if self.groups else 0.0,
            "rollouts_spent": self.spent,
            "rollouts_per_useful_group": round(self.spent / self.useful, 2) if self.useful else None,
            "trainer_samples": self.samples,
            "mean_reward_std_of_useful": round(self.std_sum / self.useful, 4) if self.useful else None,
        }  # fmt: skip


def _drawer(p: float, abort_rate: float, rng: random.Random) -> Callable[[Task], Any]:
    async def draw(task: Task) -> RolloutResult:
        if rng.random() < abort_rate:
            return RolloutResult(task.id, "sim", Status.ABORTED, 0, "", None, [], None, reward=None)
        reward = 1.0 if rng.random() < p else -1.0
        return RolloutResult(task.id, "sim", Status.COMPLETED, 1, "", None, [], None, reward=reward)

    return draw


async def run_grpo(group_size: int, budget: int, seed: int, abort_rate: float) -> Tally:
    tasks, outcomes, tally = random.Random(seed), random.Random(seed + 10_000), Tally()
    while tally.spent + group_size <= budget:
        draw = _drawer(difficulty(tasks), abort_rate, outcomes)
        task = Task(f"t{tally.tasks}", "")
        results = [await draw(task) for _ in range(group_size)]
        tally.tasks += 1
        tally.spent += group_size
        tally.add([r.reward for r in results])
    return tally


async def run_bar(config: BarConfig, budget: int, seed: int, abort_rate: float) -> Tally:
    tasks, outcomes, tally = random.Random(seed), random.Random(seed + 10_000), Tally()
    keep_rng = random.Random(seed + 20_000)
    while tally.spent + config.max_rollouts <= budget:
        draw = _drawer(difficulty(tasks), abort_rate, outcomes)
        group = await sample_group(Task(f"t{tally.tasks}", ""), draw, config, rng=keep_rng)
        tally.tasks += 1
        tally.spent += group.spent
        if group.kept:
            tally.add([r.reward for r in group.group])
    return tally


def _mean(reports: list[dict[str, float | None]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key in reports[0]:
        values = [v for r in reports if (v := r[key]) is not None]
        out[key] = round(sum(values) / len(values), 3) if values else None
    return out


async def simulate(budget: int, seeds: list[int], abort_rate: float) -> dict[str, Any]:
    samplers: dict[str, Callable[[int], Any]] = {
        "grpo_n4": lambda s: run_grpo(4, budget, s, abort_rate),
        "grpo_n8": lambda s: run_grpo(8, budget, s, abort_rate),
        "bar_n4_max8_stride8": lambda s: run_bar(BarConfig(), budget, s, abort_rate),
        "bar_n4_max8_stride4": lambda s: run_bar(BarConfig(stride=4), budget, s, abort_rate),
        "bar_n4_max16_stride4": lambda s: run_bar(
            BarConfig(max_rollouts=16, stride=4), budget, s, abort_rate
        ),
        "bar_paper_band_n4_max8_stride4": lambda s: run_bar(
            BarConfig(stride=4, pmin=0.375, pmax=0.625), budget, s, abort_rate
        ),
    }
    results: dict[str, Any] = {}
    for name, run in samplers.items():
        results[name] = _mean([(await run(seed)).report() for seed in seeds])
    return {
        "budget": budget, "seeds": seeds, "abort_rate": abort_rate,
        "mixture": "35% p=0, 15% Beta(0.5,4), 20% Beta(2,2), 15% Beta(4,0.5), 15% p=1",
        "samplers": results,
    }  # fmt: skip


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--budget", type=int, default=8000)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--abort-rate", type=float, default=0.03)
    args = parser.parse_args(argv)
    print(json.dumps(asyncio.run(simulate(args.budget, args.seeds, args.abort_rate)), indent=2))


if __name__ == "__main__":
    main()
