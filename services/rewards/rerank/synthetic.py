"""A generated rollout set whose label depends on real trajectory features.

For tests and for trying the reranker without real rollouts. Each task names
a module and a function with a bug; each rollout is a plausible trajectory
(reads, a reproduction, edits, test runs with real-looking pytest output) and
a patch. Whether it is resolved is drawn from a probability that depends on
what the trajectory shows: the patch edits the module the task names, the
final test run passes, the bug was reproduced first; a final run with failures
or no test run at all lowers it. A reranker that reads the trajectory can
beat a random pick; one that does not cannot.
"""

from __future__ import annotations

import math
import random

from .store import Rollout

_MODULES = [
    "parser",
    "cache",
    "router",
    "units",
    "dates",
    "config",
    "tokens",
    "paths",
    "render",
    "money",
]
_FUNCS = [
    "parse",
    "lookup",
    "resolve",
    "convert",
    "normalise",
    "merge",
    "split",
    "format",
    "round_half",
    "encode",
]


def _pytest_output(passed: int, failed: int, module: str) -> str:
    lines = [f"collected {passed + failed} items", ""]
    lines += [f"PASSED tests/test_{module}.py::test_case_{i}" for i in range(passed)]
    lines += [
        f"FAILED tests/test_{module}.py::test_edge_{i} - AssertionError" for i in range(failed)
    ]
    summary = f"{failed} failed, {passed} passed" if failed else f"{passed} passed"
    return "\n".join([*lines, f"==== {summary} in 0.{random.randint(10, 99)}s ===="])


def _rollout(rng: random.Random, task_id: str, module: str, func: str, n: int) -> Rollout:
    right_file = rng.random() < 0.6
    reproduced = rng.random() < 0.5
    ran_tests = rng.random() < 0.75
    final_fail = ran_tests and rng.random() < 0.4
    edited = module if right_file else rng.choice([m for m in _MODULES if m != module])
    steps: list[dict[str, str]] = [
        {"role": "assistant", "content": f"Let me look at src/{edited}.py"},
        {"role": "tool", "content": f"def {func}(value):\n    ...\n" * rng.randint(1, 4)},
    ]
    if reproduced:
        steps += [
            {
                "role": "assistant",
                "content": f"python3 -c 'from src.{module} import {func}; print({func}(3))'",
            },
            {
                "role": "tool",
                "content": "Traceback (most recent call last):\nValueError: bad value",
            },
        ]
    steps += [
        {"role": "assistant", "content": f"I will edit src/{edited}.py to handle the edge case."},
        {"role": "tool", "content": "File edited."},
    ]
    if ran_tests:
        failed = rng.randint(1, 3) if final_fail else 0
        steps += [
            {"role": "assistant", "content": f"python3 -m pytest -rA tests/test_{module}.py"},
            {"role": "tool", "content": _pytest_output(rng.randint(3, 8), failed, module)},
        ]
    steps.append({"role": "assistant", "content": "Done, submitting the patch."})
    patch = (
        f"diff --git a/src/{edited}.py b/src/{edited}.py\n--- a/src/{edited}.py\n+++ b/src/{edited}.py\n"
        f"@@ -1,2 +1,3 @@\n def {func}(value):\n+    value = {rng.choice(['abs(value)', 'int(value)', 'value or 0'])}\n"
    )
    logit = (
        -1.6
        + 2.2 * right_file
        + 0.8 * reproduced
        + 1.2 * (ran_tests and not final_fail)
        - 1.4 * final_fail
    )
    resolved = rng.random() < 1 / (1 + math.exp(-logit))
    return Rollout(
        task_id=task_id,
        task=f"{func}() in src/{module}.py fails on negative values",
        trajectory=steps,
        patch=patch,
        resolved=resolved,
        reward=1.0 if resolved else -1.0,
        rollout_id=f"{task_id}-r{n}",
    )


def generate(tasks: int = 120, per_task: int = 8, seed: int = 0) -> list[Rollout]:
    rng = random.Random(seed)
    out = []
    for t in range(tasks):
        module, func = rng.choice(_MODULES), rng.choice(_FUNCS)
        out += [_rollout(rng, f"task-{t}", module, func, n) for n in range(per_task)]
    return out
