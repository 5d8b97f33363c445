"""Every bundled task's FAIL_TO_PASS and PASS_TO_PASS, checked by running them through the
real rewards grader on a real stack (``orchard up``: runc sandboxes from the default image).

For each task (the ten real bugs ``make swe-tasks`` builds, and the calc_divide sample) the
grader runs twice, in parallel sandboxes: on a change that touches no code (a new notes
file), where every FAIL_TO_PASS test must fail and every PASS_TO_PASS test pass; and on the
gold patch (the upstream fix), where all must pass and the task is resolved. The lists
must also be exactly what the two runs' statuses give (``bundled derive``): no test that
flips is missing from them.
"""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from orchard.recipes.swe.bundled import (
    UNCHANGED_PATCH,
    bundled_tasks,
    instances_path,
    split_statuses,
)
from orchard.recipes.swe.tasks import SweTask, load_tasks

from orchard import GradeReport, Rewards
from tests.stack import REQUIRES_STACK, running_stack

pytestmark = [*REQUIRES_STACK, pytest.mark.timeout(1500)]

SAMPLES = Path(__file__).parents[3] / "recipes" / "swe" / "samples" / "instances.jsonl"
PARALLEL = 4


@pytest.fixture(scope="module")
def rewards(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Rewards]:
    with running_stack(tmp_path_factory.mktemp("swe-tasks-home")) as stack:
        endpoint = (stack.home / "run" / "rewards.addr").read_text().strip()
        yield Rewards(endpoint, (stack.home / "dev-api-key").read_text().strip())


def _tasks() -> list[SweTask]:
    path = instances_path()
    if not path.exists():
        pytest.fail(f"{path} is missing: `make swe-tasks` builds the bundled tasks")
    bundled = load_tasks(path, "orchard")
    assert [t.instance_id for t in bundled] == [t.instance_id for t in bundled_tasks()], (
        f"{path} is stale: `make swe-tasks` rebuilds it"
    )
    return load_tasks(SAMPLES, "orchard") + bundled


def _problems(task: SweTask, before: GradeReport, after: GradeReport) -> list[str]:
    f2p, p2p = sorted(task.fail_to_pass), sorted(task.pass_to_pass)
    found = []
    if (before.kind, before.resolved) != ("graded", False):
        found.append(f"unchanged code: {before.kind} resolved={before.resolved} {before.reason}")
    elif sorted(before.fail_to_pass[1]) != f2p or before.fail_to_pass[0]:
        found.append(f"unchanged code: FAIL_TO_PASS passing {before.fail_to_pass[0]}")
    if sorted(before.pass_to_pass[0]) != p2p:
        found.append(f"unchanged code: PASS_TO_PASS failing {before.pass_to_pass[1]}")
    if (after.kind, after.resolved, after.reward) != ("graded", True, 1.0):
        found.append(f"gold patch: {after.kind} resolved={after.resolved} {after.reason}")
    if sorted(after.fail_to_pass[0]) != f2p or sorted(after.pass_to_pass[0]) != p2p:
        found.append(
            f"gold patch: failing {after.fail_to_pass[1] + after.pass_to_pass[1]}, "
            f"missing {sorted(set(f2p + p2p) - set(after.fail_to_pass[0] + after.pass_to_pass[0]))}"
        )
    if split_statuses(before.test_statuses, after.test_statuses) != (f2p, p2p):
        found.append("the lists are not what this run derives (bundled derive --write)")
    if after.apply_method != "git apply":
        found.append(f"gold patch applied by {after.apply_method!r}, not a clean git apply")
    return [f"{task.instance_id}: {p}" for p in found]


def test_every_task_fails_before_and_passes_after_its_gold_patch(rewards: Rewards) -> None:
    tasks = _tasks()
    assert len(tasks) >= 11
    jobs = [(task, patch) for task in tasks for patch in (UNCHANGED_PATCH, task.gold_patch)]
    with ThreadPoolExecutor(PARALLEL) as pool:
        reports = list(pool.map(lambda job: rewards.grade(job[0].grading_instance(), job[1]), jobs))
    problems = []
    for i, task in enumerate(tasks):
        before, after = reports[2 * i], reports[2 * i + 1]
        problems += _problems(task, before, after)
        assert before.instance_id == after.instance_id == task.instance_id
    assert not problems, "\n".join(problems)
