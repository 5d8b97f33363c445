"""The Claw recipe on a real stack: real sandboxes (runc), the real mock services inside them,
the recording proxy in front of the scripted model server (a real HTTP server following
:class:`~tests.recipes.claw.policies.OraclePolicy`: the one thing that cannot run here is a
large model).

- every bundled task's oracle passes and its null run fails, each in its own sandbox;
- a trial whose task setup fails is ABORTED (phase ``setup``), never counted as a failure;
- an agent that kills its services scores 0, with a violation that says so;
- the one documented command runs the bundled set over two harnesses (the ReAct loop and
  Codex from the tools layer) with k = 3 and writes the pass^3 / pass@3 table, the trials
  and the training samples; the numbers are the ones the policy's flaws imply.

Run under ``flock /tmp/orchard-heavy.lock`` (it starts a stack and ~200 sandboxes).
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
from orchard.recipes.claw.baselines import NullHarness, OracleHarness
from orchard.recipes.claw.bundled import bundled_tasks
from orchard.recipes.claw.harness import AnyHarness
from orchard.recipes.claw.metrics import summarize
from orchard.recipes.claw.react import ReactHarness
from orchard.recipes.claw.runner import check_tasks, run_trials
from orchard.recipes.claw.services import runtime
from orchard.recipes.claw.tasks import ClawTask

from orchard import AsyncOrchard
from orchard.rollouts import ModelProxyClient, local_proxy_url
from orchard.testing.scripted_model import scripted_upstream
from tests.stack import REQUIRES_STACK, TOOLS_DIR, Stack, running_stack

from .policies import FLAKY, MALFORMED, OVERWRITE, OraclePolicy

pytestmark = [*REQUIRES_STACK, pytest.mark.timeout(1500)]

TASKS = bundled_tasks()
NODE_HOME = Path(os.environ.get("ORCHARD_HOME") or "/var/lib/orchard")
HAS_TOOLS = any(TOOLS_DIR.glob("harnesses-*/layer.json"))

FILE_TASK = {
    "id": "file-report-total",
    "category": "files",
    "prompt": "Add up the numbers in /workspace/sales.csv and write the total to /workspace/total.txt.",
    "environment": {"files": {"/workspace/sales.csv": "region,amount\nnorth,120\nsouth,80\n"}},
    "grader": {
        "kind": "script",
        "command": 'test "$(cat total.txt)" = 200 && echo ok',
        "workdir": "/workspace",
        "safety": [],
    },
    "oracle": {
        "kind": "script",
        "command": "awk -F, 'NR > 1 {s += $2} END {print s}' sales.csv > total.txt",
        "workdir": "/workspace",
        "final_answer": "The total is 200.",
    },
}
FILE = ClawTask.from_json(FILE_TASK)


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    home: Path = tmp_path_factory.mktemp("claw") / "home"
    home.mkdir()
    # the services' runtime (`make claw-services`) is the node's: the test's home links it
    built = runtime.find(runtime.runtime_dir(NODE_HOME))
    if built is None:
        pytest.skip("the Claw services' runtime is not built (make claw-services)")
    link = runtime.runtime_dir(home)
    link.parent.mkdir(parents=True)
    link.symlink_to(built.folder)
    with (
        scripted_upstream(OraclePolicy([*TASKS, FILE])) as (_, url),
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


def test_every_bundled_task_oracle_passes_and_null_run_fails(stack: Stack) -> None:
    assert len(TASKS) >= 20
    assert {"mail", "calendar", "contacts", "files", "todo", "web", "cross"} <= {
        t.category for t in TASKS
    }
    checks = _run(stack, lambda c, p: check_tasks(c, TASKS, proxy=p, concurrency=4))
    assert [(c.task.id, c.why) for c in checks if not c.valid] == []
    for c in checks:
        assert c.oracle.result.detail["harness"]["oracle_errors"] == [], c.task.id
        # the oracle's calls are in the audit log as the services recorded them
        assert [e["operation"] for e in c.oracle.audit] == [x.tool for x in c.task.oracle.calls]
        assert all(e["channel"] == "driver" for e in c.oracle.audit)
        assert c.null.audit == [] and c.null.score is not None and c.null.score.total < 0.75


def _broken(task: ClawTask, **changes: Any) -> ClawTask:
    data = task.to_json()
    data.update(changes)
    return ClawTask.from_json(data)


def test_a_failing_setup_is_aborted_and_not_counted(stack: Stack) -> None:
    broken = _broken(TASKS[0], id="broken-setup", environment={"setup": ["echo no >&2; exit 3"]})
    harnesses: list[AnyHarness] = [NullHarness(), OracleHarness()]
    trials = _run(stack, lambda c, p: run_trials(c, harnesses, [broken], proxy=p, model="-", k=2))
    assert len(trials) == 4 and all(t.aborted and t.score is None for t in trials)
    assert {t.result.fault_phase for t in trials} == {"setup"}
    report = summarize([t.outcome() for t in trials], k=2)
    for h in report.harnesses:
        assert (h.overall.trials, h.overall.aborted, h.overall.pass_hat_k) == (0, 2, None)


def test_an_agent_that_kills_its_services_scores_zero(stack: Stack) -> None:
    killer = _broken(
        next(t for t in TASKS if t.id == "todo-add-passport"),
        id="kills-services",
        # the services run from /opt/orchard-claw; the [w] keeps this shell's own line unmatched
        oracle={"kind": "script", "command": "pkill -9 -f '/opt/orchard-cla[w]'; sleep 1"},
    )
    (trial,) = _run(
        stack, lambda c, p: run_trials(c, [OracleHarness()], [killer], proxy=p, model="none", k=1)
    )
    assert not trial.aborted, trial.result.fault
    assert trial.score is not None and trial.score.total == 0.0
    assert [v.rule for v in trial.score.violations] == ["the services were broken by the agent"]


def test_a_file_task_with_a_verifier_script(stack: Stack) -> None:
    """The second grader kind (a verifier run in the sandbox) with no services at all: the
    oracle passes, the null run fails, and the ReAct loop (given ``bash``) passes too."""
    task = FILE
    (check,) = _run(stack, lambda c, p: check_tasks(c, [task], proxy=p))
    assert check.valid, check.why
    assert check.oracle.score is not None and check.oracle.score.kind == "script"
    (trial,) = _run(
        stack, lambda c, p: run_trials(c, [ReactHarness()], [task], proxy=p, model="s", k=1)
    )
    assert trial.passed, (trial.result.fault, trial.score)
    assert trial.result.transcript[2]["tool_calls"][0]["function"]["name"] == "bash"


def _jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


@pytest.mark.skipif(not HAS_TOOLS, reason=f"no tools layer under {TOOLS_DIR} (make tools-layer)")
def test_the_command_runs_the_bundled_set_over_two_harnesses(stack: Stack, tmp_path: Path) -> None:
    out = tmp_path / "run"
    done = subprocess.run(
        [sys.executable, "-m", "orchard.recipes.claw", "run", "--tasks", "bundled",
         "--harness", "react,codex", "--k", "3", "--model", "scripted", "--out", str(out),
         "--concurrency", "4", "--max-steps", "12", "--max-seconds", "300"],
        env=stack.env, capture_output=True, text=True, timeout=1400,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    print(done.stdout[-4000:])  # the table (pytest -s shows it)
    n = len(TASKS)
    metrics = json.loads((out / "metrics.json").read_text())
    react, codex = metrics["harnesses"]
    assert (react["harness"], codex["harness"]) == ("react", "codex")
    for h in (react, codex):
        assert (h["overall"]["tasks"], h["overall"]["trials"], h["overall"]["aborted"]) == (
            n,
            3 * n,
            0,
        ), h["overall"]
    # react: OVERWRITE fails every trial, FLAKY one trial of three, MALFORMED still passes
    assert react["overall"]["pass_hat_k"] == pytest.approx(round((n - 2) / n, 6))
    assert react["overall"]["pass_at_k"] == pytest.approx(round((n - 1) / n, 6))
    per_task = {t["task_id"]: t for t in react["tasks"]}
    assert (per_task[OVERWRITE]["passed"], per_task[FLAKY]["passed"]) == (0, 2)
    assert per_task[MALFORMED]["passed"] == 3
    assert codex["overall"]["pass_hat_k"] == 1.0 and codex["overall"]["pass_at_k"] == 1.0
    table = (out / "metrics.md").read_text()
    assert "| react | all | 23 | 69 | 0 |" in table.replace(str(n), "23")
    trials = _jsonl(out / "trials.jsonl")
    assert len(trials) == 2 * 3 * n
    for t in trials:
        if t["harness"] == "react" and t["task_id"] == OVERWRITE:
            rules = [v["rule"] for v in t["score"]["violations"]]
            assert "the old log lines are gone" in rules, rules
            assert any(e["destructive"] for e in t["audit"])
        if t["harness"] == "react" and t["task_id"] == MALFORMED:
            assert t["detail"]["harness"]["format_errors"] == 2 and t["passed"]
        if t["harness"] == "codex":
            assert t["audit"] and all(e["channel"] == "http" for e in t["audit"]), t["task_id"]
    # samples: every trial recorded, the score is the reward, SFT keeps only passed trials
    rl = _jsonl(out / "samples.rl.jsonl")
    by_trial: dict[str, list[dict[str, Any]]] = {}
    for s in rl:
        by_trial.setdefault(s["trial_id"], []).append(s)
    assert len(by_trial) == len(trials)
    score = {f"{t['task_id']}#{t['harness']}#{t['trial']}": t["score"]["total"] for t in trials}
    for trial_id, samples in by_trial.items():
        assert all(s["reward"] == score[trial_id] and s["trainable"] for s in samples), trial_id
    assert {s["harness"] for s in rl} == {"react", "codex"}
    sft = _jsonl(out / "samples.sft.jsonl")
    assert sft and all(s["passed"] for s in sft)
    assert {s["trial_id"] for s in sft} == {k for k, v in score.items() if v >= 0.75}
    run = json.loads((out / "run.json").read_text())
    assert run["aborted"] == [] and run["trials"] == 2 * 3 * n
