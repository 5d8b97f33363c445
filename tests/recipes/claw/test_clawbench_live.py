"""claw-bench's tasks through the Claw runner on a real stack: runc sandboxes of the default
image, network ``none``, the recording proxy in front of the scripted model server (a real HTTP
server following :class:`~tests.recipes.claw.clawbench_policy.ReplayPolicy`: the one thing that
cannot run here is a large model).

- a representative subset (the first two accepted tasks of every category, and every refused
  task) is checked again: reference solution and null run, each in a fresh sandbox through
  ``runner.check_tasks``; every verdict (status and reason) is the checked-in triage's, so
  each accepted task's reference passes and its null run fails, and each refusal still holds;
- with ``ORCHARD_CLAWBENCH_FULL=1``, all 222 task folders (about two minutes here);
- three tasks of three categories run k = 3 trials through the runner's ReAct loop (and Codex
  from the tools layer when it is built) with the scripted model replaying the reference
  solution through the harness's shell tool: every trial passes (pass^3 = 1), except a task
  the model leaves untouched, which every trial fails (pass@3 = 0);
- the documented commands: ``clawbench export`` then ``python -m orchard.recipes.claw run``.

Run under ``flock /tmp/orchard-heavy.lock`` (a stack and ~150 sandboxes; ~1 minute).
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from orchard.recipes.claw.clawbench.check import run_check
from orchard.recipes.claw.clawbench.convert import claw_tasks
from orchard.recipes.claw.clawbench.source import load_catalogue
from orchard.recipes.claw.clawbench.triage_file import load_triage
from orchard.recipes.claw.metrics import summarize
from orchard.recipes.claw.react import ReactHarness
from orchard.recipes.claw.runner import AnyHarness, run_trials

from orchard import AsyncOrchard
from orchard.rollouts import ModelProxyClient, local_proxy_url
from orchard.rollouts.harnesses import HARNESSES
from orchard.testing.scripted_model import scripted_upstream
from tests.stack import REQUIRES_STACK, TOOLS_DIR, Stack, running_stack

from .clawbench_policy import ReplayPolicy

pytestmark = [*REQUIRES_STACK, pytest.mark.timeout(1200)]

FULL = os.environ.get("ORCHARD_CLAWBENCH_FULL") == "1"
HAS_TOOLS = any(TOOLS_DIR.glob("harnesses-*/layer.json"))
TRIAGE = load_triage()
RUNNER_TASKS = ("eml-001", "cal-001", "data-002")
LAZY = "data-002"


def _subset() -> list[str]:
    picked: dict[str, list[str]] = {}
    chosen = []
    for e in TRIAGE["tasks"]:
        if e["status"] == "refused":
            chosen.append(e["id"])
        elif len(picked.setdefault(e["category"], [])) < 2:
            picked[e["category"]].append(e["id"])
            chosen.append(e["id"])
    return chosen


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    home: Path = tmp_path_factory.mktemp("claw-bench") / "home"
    home.mkdir()
    policy = ReplayPolicy(claw_tasks(only=RUNNER_TASKS), lazy=[LAZY])
    with (
        scripted_upstream(policy) as (_, url),
        running_stack(home, up_args=["--model-upstream", url]) as running,
    ):
        yield running


def _run(stack: Stack, body: Any) -> Any:
    api_key = (stack.home / "dev-api-key").read_text().strip()

    async def main() -> Any:
        async with (
            AsyncOrchard(stack.endpoint, api_key) as client,
            ModelProxyClient(local_proxy_url(stack.home), api_key) as proxy,
        ):
            return await body(client, proxy)

    return asyncio.run(main())


def _check_against_the_triage(stack: Stack, ids: list[str] | None) -> None:
    catalogue = load_catalogue()
    tasks = None if ids is None else [t for t in catalogue.tasks if t.id in set(ids)]
    run = _run(stack, lambda c, p: run_check(c, p, catalogue, tasks, concurrency=4))
    expected = {e["id"]: e for e in TRIAGE["tasks"]}
    assert len(run.verdicts) == (len(expected) if ids is None else len(ids))
    differ = []
    for v in run.verdicts:
        want = expected[v.id]
        if (v.status, v.reason) != (want["status"], want["reason"]):
            differ.append(f"{v.id}: {v.status}/{v.reason} ({v.detail}), triage says "
                          f"{want['status']}/{want['reason']}")  # fmt: skip
        if v.status == "accepted":  # what acceptance means, from the trials themselves
            assert v.reference is not None and v.null is not None
            assert v.reference["score"] == 1.0 and v.reference["failing"] == [], v.id
            assert v.null["score"] < 0.75 and v.null["failing"], v.id
    assert not differ, "\n".join(differ)


def test_a_subset_of_every_category_matches_the_checked_in_triage(stack: Stack) -> None:
    ids = _subset()
    assert len({e["category"] for e in TRIAGE["tasks"] if e["id"] in ids}) == 14
    _check_against_the_triage(stack, ids)


@pytest.mark.skipif(
    not FULL, reason="optional: the full 222-task check (ORCHARD_CLAWBENCH_FULL=1, a few minutes)"
)
def test_every_task_matches_the_checked_in_triage(stack: Stack) -> None:
    _check_against_the_triage(stack, None)


def test_claw_bench_tasks_go_through_the_runner_with_a_model_replaying_the_solution(
    stack: Stack,
) -> None:
    tasks = claw_tasks(only=RUNNER_TASKS)
    assert len({t.category for t in tasks}) == 3
    harnesses: list[AnyHarness] = [ReactHarness()]
    if HAS_TOOLS:
        harnesses.append(HARNESSES["codex"]())
    trials = _run(stack, lambda c, p: run_trials(c, harnesses, tasks, proxy=p, model="scripted",
                                                 k=3, concurrency=4))  # fmt: skip
    assert len(trials) == 3 * len(tasks) * len(harnesses)
    assert [t.result.fault for t in trials if t.aborted] == []
    for t in trials:
        assert t.score is not None and t.score.kind == "script"
        assert t.result.samples, f"{t.task_id}/{t.harness}: no recorded sample"
        if t.task_id == LAZY:
            assert not t.passed and t.score.total < 0.75, (t.harness, t.score.total)
        else:
            assert t.passed and t.score.total == 1.0, (t.task_id, t.harness, t.score)
    report = summarize([t.outcome() for t in trials], k=3)
    for h in report.harnesses:
        per_task = {s.task_id: s for s in h.tasks}
        assert per_task[LAZY].pass_at_k == 0.0
        assert per_task["eml-001"].pass_hat_k == per_task["cal-001"].pass_hat_k == 1.0
        assert h.overall.pass_hat_k == pytest.approx(2 / 3, abs=1e-6)


def test_the_documented_commands_export_and_run(stack: Stack, tmp_path: Path) -> None:
    tasks_dir, out = tmp_path / "tasks", tmp_path / "run"
    exported = subprocess.run(
        [sys.executable, "-m", "orchard.recipes.claw.clawbench", "export", "--out",
         str(tasks_dir), "--only", ",".join(RUNNER_TASKS)],
        env=stack.env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert exported.returncode == 0, exported.stderr
    done = subprocess.run(
        [sys.executable, "-m", "orchard.recipes.claw", "run", "--tasks", str(tasks_dir),
         "--harness", "react", "--k", "3", "--model", "scripted", "--out", str(out),
         "--concurrency", "4", "--max-steps", "8", "--max-seconds", "300"],
        env=stack.env, capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    metrics = json.loads((out / "metrics.json").read_text())
    (react,) = metrics["harnesses"]
    assert (react["overall"]["tasks"], react["overall"]["trials"]) == (3, 9)
    assert react["overall"]["pass_hat_k"] == pytest.approx(round(2 / 3, 6))
    assert react["overall"]["pass_at_k"] == pytest.approx(round(2 / 3, 6))
