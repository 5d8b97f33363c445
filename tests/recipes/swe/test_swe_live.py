"""The SWE recipe end to end on a real stack: ``python -m orchard.recipes.swe run`` over the
bundled task (and a second copy the scripted policy gives up on), the model being the scripted
upstream behind ``orchard up``'s recording proxy, the sandboxes real (runc), the grades from
the rewards service's SWE grader and best-of-N from its value model (trained beforehand on
the reranker's generated rollouts, as a node's ``<home>/rewards/value_model.npz``)."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from orchard.recipes.swe.agent import BashAgent
from orchard.recipes.swe.instances import SAMPLES, load_tasks
from orchard.recipes.swe.runner import SweDraw
from orchard.rewards.rerank.model import ValueModel
from orchard.rewards.rerank.synthetic import generate

import orchard
from orchard.rollouts import ModelProxyClient, RolloutResult, Status
from orchard.testing.scripted_model import scripted_upstream
from tests.recipes.swe.policies import solves_calc_divide
from tests.stack import REQUIRES_STACK, running_stack

pytestmark = REQUIRES_STACK


def _rows(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


async def _draw_once(endpoint: str, key: str, home: Path, tasks: Path) -> RolloutResult:
    proxy_url = (home / "run" / "modelproxy.addr").read_text().strip()
    async with (
        orchard.AsyncOrchard(
            endpoint, key, rewards_endpoint=(home / "run" / "rewards.addr").read_text().strip()
        ) as client,
        ModelProxyClient(proxy_url, key) as proxy,
        BashAgent() as agent,
    ):
        draw = SweDraw(client, agent, proxy=proxy, model="scripted")
        return await draw(load_tasks(tasks)[0])


def test_the_recipe_runs_end_to_end_with_a_scripted_model(tmp_path: Path) -> None:
    home = tmp_path / "home"
    (home / "rewards").mkdir(parents=True)
    ValueModel.train(generate(tasks=30, per_task=4, seed=1)).save(
        home / "rewards" / "value_model.npz"
    )
    solvable = _rows(SAMPLES)[0]
    hopeless = {
        **solvable,
        "instance_id": "orchard-samples__calc_divide-hopeless",
        "problem_statement": "calc.mean is wrong somehow; nobody knows how.",
    }
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text(json.dumps(solvable) + "\n" + json.dumps(hopeless) + "\n")
    out = tmp_path / "run"
    with (
        scripted_upstream(solves_calc_divide) as (upstream, url),
        running_stack(home, up_args=["--model-upstream", url]) as stack,
    ):
        done = subprocess.run(
            [sys.executable, "-m", "orchard.recipes.swe", "run", "--tasks", str(tasks),
             "--out", str(out), "--samples", "2", "--k", "1,2", "--model", "scripted"],
            env=stack.env, capture_output=True, text=True, timeout=600,
        )  # fmt: skip
        assert done.returncode == 0, done.stdout + done.stderr
        assert "Traceback" not in done.stderr, done.stderr
        key = (home / "dev-api-key").read_text().strip()
        drawn = asyncio.run(_draw_once(stack.endpoint, key, home, tasks))
        with orchard.Orchard(stack.endpoint, key) as client:
            left = client.sandboxes.list()
    # the draw a BAR sampler is given: one rollout, graded, its reward on the session
    assert drawn.status is Status.COMPLETED and drawn.reward == 1.0, drawn.fault
    assert [s["reward"] for s in drawn.samples] == [1.0]
    rollouts = _rows(out / "rollouts.jsonl")
    assert len(rollouts) == 4
    assert {r["status"] for r in rollouts} == {"completed"}, [r["fault"] for r in rollouts]
    by_task: dict[str, list[dict[str, Any]]] = {}
    for r in rollouts:
        by_task.setdefault(r["task_id"], []).append(r)
    for r in by_task[solvable["instance_id"]]:
        assert r["resolved"] is True and r["reward"] == 1.0, r["grade"]
        assert r["grade"]["kind"] == "graded" and "len(values)" in r["diff"]
        assert r["steps"] == 4 and r["detail"]["harness"]["format_errors"] == 0
    for r in by_task[hopeless["instance_id"]]:
        assert r["resolved"] is False and r["reward"] == -1.0
        assert r["grade"]["kind"] == "no_patch" and r["diff"] == ""
    # the recorded samples carry the reward the grader gave; SFT keeps the resolved ones
    rl = _rows(out / "samples.rl.jsonl")
    assert len(rl) == 4 and all(s["token_exact"] and s["trainable"] for s in rl)
    rewards = {s["rollout_id"]: s["reward"] for s in rl}
    assert rewards == {r["rollout_id"]: r["reward"] for r in rollouts}
    sft = _rows(out / "samples.sft.jsonl")
    assert sorted(s["rollout_id"] for s in sft) == sorted(
        r["rollout_id"] for r in by_task[solvable["instance_id"]]
    )
    assert all(sum(s["loss_mask"]) > 0 for s in sft)
    # the evaluation: half the tasks solved, every sample of each alike
    report = json.loads((out / "eval.json").read_text())
    assert report["pass@1"] == 0.5 and report["pass@k"]["2"]["value"] == 0.5
    assert report["oracle"] == 0.5 and report["aborted"] == 0
    assert report["best_of_n"]["value"] == 0.5, report["best_of_n"]
    assert "pass@2" in (out / "eval.txt").read_text()
    assert len(_rows(out / "rerank_store.jsonl")) == 4
    run = json.loads((out / "run.json").read_text())
    assert run["statuses"] == {"completed": 4, "truncated": 0, "aborted": 0}
    # every model call went through the proxy, and no sandbox outlived its rollout or grading
    assert len(upstream.requests) == 4 + 4 + 2 + 4  # 4 steps x 2, 1 step x 2, the draw's 4
    assert left == [], left
