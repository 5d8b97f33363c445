"""The SWE recipe end to end on a real stack, the one documented command:
``python -m orchard.recipes.swe run --sampler bar --casft-teacher teacher``, over the bundled
tasks (the calc_divide sample and two of the ten real bugs ``make swe-tasks`` builds, copied
into the stack's home where the command looks for them by default).

The model is a scripted upstream behind ``orchard up``'s recording proxy (a real HTTP server
following a policy); the sandboxes are real (runc); the grades come from the rewards
service's SWE grader; the CA-SFT teacher is a second scripted upstream that the rewards
service's judge calls (``ORCHARD_JUDGE_*``); best-of-N uses the service's value model
(trained beforehand on the reranker's generated rollouts, as ``<home>/rewards/value_model.npz``).

The policy: calc_divide is solved on every other rollout (so its BAR group balances), the
semver bug is fixed with its gold patch every time (all success: dropped), the parse bug is
given up on every time (all failure: dropped). Every failed trajectory reads the code, takes
a "wrong turn", then submits: the teacher marks the wrong turn as the critical mistake.
"""

from __future__ import annotations

import itertools
import json
import math
import re
import shutil
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from orchard.recipes.swe.bundled import instances_path
from orchard.recipes.swe.cli import SAMPLES
from orchard.recipes.swe.tasks import SweTask, load_tasks
from orchard.rewards.rerank.model import ValueModel
from orchard.rewards.rerank.synthetic import generate

import orchard
from orchard.testing.scripted_model import scripted_upstream
from tests.recipes.swe.policies import FIX_CALC, SENTINEL_CMD, bash, turn
from tests.stack import REQUIRES_STACK, running_stack

pytestmark = [*REQUIRES_STACK, pytest.mark.timeout(300)]

CALC = "orchard-samples__calc_divide-1"
GOLD = "python-semver__python-semver-bc41390"
GIVE_UP = "r1chardj0n3s__parse-9c9ec7f"
WRONG = "echo 'this is the wrong turn'"
FAILING = ["ls", WRONG, SENTINEL_CMD]
BAR = {"n": 2, "max": 4, "stride": 2, "band": (0.5, 0.5)}


def _rows(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _first_command(body: dict[str, Any]) -> str:
    for m in body["messages"]:
        if m.get("role") == "assistant" and m.get("tool_calls"):
            return str(json.loads(m["tool_calls"][0]["function"]["arguments"])["command"])
    return ""


class Policy:
    """The scripted agent: which task it is shown decides what it does (see the module doc)."""

    def __init__(self, tasks: dict[str, SweTask]) -> None:
        self.tasks = tasks
        self.calc_rollouts = itertools.count()
        self.lock = threading.Lock()

    def plan(self, task_id: str, body: dict[str, Any]) -> list[str]:
        if task_id == GOLD:
            patch = self.tasks[GOLD].gold_patch
            return [f"git apply - <<'ORCHARD_PATCH'\n{patch.rstrip(chr(10))}\nORCHARD_PATCH",
                    SENTINEL_CMD]  # fmt: skip
        if task_id == CALC:
            first = _first_command(body)
            if not first:  # a new rollout: every other one solves
                with self.lock:
                    solve = next(self.calc_rollouts) % 2 == 0
            else:
                solve = first != FAILING[0]
            if solve:
                return ["cat calc/__init__.py", FIX_CALC, SENTINEL_CMD]
        return FAILING

    def __call__(self, body: dict[str, Any]) -> dict[str, Any]:
        prompt = str(next(m for m in body["messages"] if m.get("role") == "user")["content"])
        task_id = next(
            (i for i, t in self.tasks.items() if t.problem_statement.strip() in prompt), ""
        )
        steps = self.plan(task_id, body)
        i = turn(body)
        return bash(steps[min(i, len(steps) - 1)], f"c{i}")


def teacher(body: dict[str, Any]) -> dict[str, Any]:
    """Reads the trajectory it is shown: the wrong turn dooms the run, other steps help."""
    prompt = next(m["content"] for m in body["messages"] if m["role"] == "user")
    shown = prompt.split("Trajectory", 1)[1].split(":\n", 1)[1]
    steps = re.split(r"\n\nStep \d+:\n", "\n\n" + shown)[1:]
    values, level = [], 0.5
    for step in steps:
        level = 0.05 if "wrong turn" in step or level < 0.1 else min(1.0, level + 0.1)
        values.append(round(level, 2))
    return {"content": json.dumps({"reasoning": "scripted", "p_start": 0.5, "p_success": values})}


def _pass_at(n: int, c: int, k: int) -> float:
    return 1.0 if n - c < k else 1.0 - math.comb(n - c, k) / math.comb(n, k)


def test_one_command_runs_the_recipe_end_to_end(tmp_path: Path) -> None:
    bundled = instances_path()
    if not bundled.is_file():
        pytest.fail(f"{bundled} is missing: `make swe-tasks` builds the bundled tasks")
    home = tmp_path / "home"
    (home / "rewards").mkdir(parents=True)
    (home / "recipes" / "swe").mkdir(parents=True)
    shutil.copy(bundled, home / "recipes" / "swe" / "instances.jsonl")
    ValueModel.train(generate(tasks=30, per_task=4, seed=1)).save(
        home / "rewards" / "value_model.npz"
    )
    tasks = {
        t.instance_id: t for t in load_tasks(SAMPLES, "orchard") + load_tasks(bundled, "orchard")
    }
    out = tmp_path / "run"
    with (
        scripted_upstream(Policy(tasks)) as (_, url),
        scripted_upstream(teacher) as (teacher_upstream, teacher_url),
        running_stack(
            home,
            extra_env={"ORCHARD_JUDGE_BASE_URL": teacher_url, "ORCHARD_JUDGE_MODEL": "teacher"},
            up_args=["--model-upstream", url],
        ) as stack,
    ):
        done = subprocess.run(
            [sys.executable, "-m", "orchard.recipes.swe", "run", "--out", str(out),
             "--only", f"{CALC},{GOLD},{GIVE_UP}", "--model", "scripted", "--k", "1,2",
             "--sampler", "bar", "--bar-n", str(BAR["n"]), "--bar-max", str(BAR["max"]),
             "--bar-stride", str(BAR["stride"]), "--bar-band", "0.5,0.5",
             "--casft-teacher", "teacher", "--max-steps", "6"],
            env=stack.env, capture_output=True, text=True, timeout=240,
        )  # fmt: skip
        assert done.returncode == 0, done.stdout + done.stderr
        assert "Traceback" not in done.stderr, done.stderr
        rollouts = _rows(out / "rollouts.jsonl")
        key = (home / "dev-api-key").read_text().strip()
        rewards_addr = (home / "run" / "rewards.addr").read_text().strip()
        # the rewards are the real grader's: grade each distinct change again, directly
        distinct = {(r["task_id"], r["diff"] or ""): r for r in rollouts}
        rewards = orchard.Rewards(rewards_addr, key)
        with ThreadPoolExecutor(4) as pool:
            regraded = dict(zip(distinct, pool.map(
                lambda k: rewards.grade(tasks[k[0]].grading_instance(), k[1]), distinct
            ), strict=True))  # fmt: skip
        with orchard.Orchard(stack.endpoint, key) as client:
            # every rollout deleted its sandbox; a delete answers at "deleting" and the
            # teardown finishes in the background, so give the last ones a bounded moment
            deadline = time.monotonic() + 30
            left = client.sandboxes.list()
            while left and all(s.state == "deleting" for s in left):
                if time.monotonic() > deadline:
                    break
                time.sleep(0.2)
                left = client.sandboxes.list()

    assert {r["status"] for r in rollouts} == {"completed"}, [r["fault"] for r in rollouts]
    by_task: dict[str, list[dict[str, Any]]] = {}
    for r in rollouts:
        by_task.setdefault(r["task_id"], []).append(r)
    assert {t: len(rs) for t, rs in by_task.items()} == {CALC: 2, GOLD: 4, GIVE_UP: 4}
    rewards_rows = {r["rollout_id"]: r for r in _rows(out / "rewards.jsonl")}
    assert set(rewards_rows) == {r["rollout_id"] for r in rollouts}
    for r in rollouts:
        report = regraded[(r["task_id"], r["diff"] or "")]
        row = rewards_rows[r["rollout_id"]]
        assert (row["reward"], row["resolved"], row["kind"]) == (
            report.reward,
            report.resolved,
            report.kind,
        ), r["rollout_id"]
        assert r["grade"]["fail_to_pass"] == [list(x) for x in report.fail_to_pass]
    assert [r["resolved"] for r in by_task[GOLD]] == [True] * 4
    assert all(r["grade"]["kind"] == "graded" for r in by_task[GOLD])
    assert sorted(r["resolved"] for r in by_task[CALC]) == [False, True]
    assert all(r["reward"] == -1.0 and r["diff"] == "" for r in by_task[GIVE_UP])

    # BAR groups: the band rule, and drops that say why
    groups = {g["task_id"]: g for g in _rows(out / "bar_groups.jsonl")}
    assert set(groups) == {CALC, GOLD, GIVE_UP}
    pmin, pmax = BAR["band"]
    for g in groups.values():
        assert sorted(g["drawn"]) == sorted(r["rollout_id"] for r in by_task[g["task_id"]])
        assert g["spent"] == len(by_task[g["task_id"]])
        if g["kept"]:
            assert len(g["group"]) == BAR["n"]
            share = sum(rewards_rows[i]["resolved"] for i in g["group"]) / BAR["n"]
            assert pmin <= share <= pmax
    assert groups[CALC]["kept"] and groups[CALC]["reason"] == "balanced"
    assert groups[CALC]["spent"] == BAR["stride"] and groups[CALC]["strides"] == 1
    assert (groups[GOLD]["kept"], groups[GOLD]["reason"]) == (False, "all_success")
    assert (groups[GIVE_UP]["kept"], groups[GIVE_UP]["reason"]) == (False, "all_failure")
    assert groups[GOLD]["spent"] == groups[GIVE_UP]["spent"] == BAR["max"]

    # RL samples: the kept group's only, with its rewards; SFT: every resolved rollout's
    rl = _rows(out / "samples.rl.jsonl")
    assert sorted(s["rollout_id"] for s in rl) == sorted(groups[CALC]["group"])
    assert all(s["token_exact"] and s["trainable"] and s["group"] == CALC for s in rl)
    assert {s["rollout_id"]: s["reward"] for s in rl} == {
        i: rewards_rows[i]["reward"] for i in groups[CALC]["group"]
    }
    sft = _rows(out / "samples.sft.jsonl")
    resolved = sorted(r["rollout_id"] for r in rollouts if r["resolved"])
    assert sorted(s["rollout_id"] for s in sft) == resolved
    assert all(sum(s["loss_mask"]) > 0 for s in sft)

    # CA-SFT: one record per failed rollout; only the step before the wrong turn is trained
    casft_rows = _rows(out / "casft.sft.jsonl")
    failed = [r for r in rollouts if not r["resolved"]]
    assert len(casft_rows) == len(failed) == 5
    assert {c["session_id"] for c in casft_rows} == {r["session_id"] for r in failed}
    for c in casft_rows:
        assistant = [i for i, m in enumerate(c["messages"]) if m["role"] == "assistant"]
        assert len(c["step_loss_mask"]) == len(c["messages"])
        assert [i for i, m in enumerate(c["step_loss_mask"]) if m] == [assistant[0]]
        assert c["critical_step"] == 1 and c["trained_steps"] == [0]
        assert c["teacher"]["p_success"] == [0.6, 0.05, 0.05]
        assert len(c["loss_mask"]) == len(c["tokens"]) and sum(c["loss_mask"]) > 0
    assert teacher_upstream.requests, "the teacher was never asked"
    run = json.loads((out / "run.json").read_text())
    assert run["outputs"]["casft.sft.jsonl"]["counts"] == {"records": 5}
    assert run["outputs"]["bar_groups.jsonl"] == {"kept": 1, "dropped": 2}
    assert run["statuses"] == {"completed": 10, "truncated": 0, "aborted": 0}

    # the evaluation table: computed again from the rewards
    report = json.loads((out / "eval.json").read_text())
    tally = {t: (len(rs), sum(r["resolved"] for r in rs)) for t, rs in by_task.items()}
    assert report["pass@1"] == pytest.approx(sum(c / n for n, c in tally.values()) / 3)
    assert report["pass@k"]["2"]["value"] == pytest.approx(
        sum(_pass_at(n, c, 2) for n, c in tally.values()) / 3
    )
    assert report["oracle"] == pytest.approx(2 / 3) and report["aborted"] == 0
    assert report["best_of_n"]["value"] in (pytest.approx(1 / 3), pytest.approx(2 / 3))
    text = (out / "eval.txt").read_text()
    print(text, json.dumps(run["outputs"]["bar_groups.jsonl"]), f"{run['seconds']:.1f} s")
    assert "pass@2" in text and f"{100 * report['pass@1']:.1f}" in text
    assert left == [], left
