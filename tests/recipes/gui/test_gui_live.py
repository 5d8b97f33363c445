"""The GUI recipe end to end on a real stack: ``python -m orchard.recipes.gui run`` drives
MiniWoB tasks in real browser sandboxes (runc, the browser image, Chromium through
Playwright) with the VLM agent, its model a scripted policy behind ``orchard up``'s
recording proxy that reads the element list the agent sends to choose its clicks
(``vlm_policies.VlmPolicy``), its judge a scripted one (``vlm_policies.judge_policy``).

Checked: the good policy solves five tasks (MiniWoB's own reward says so) and is paid 1.0;
the judge saw at most three screenshots; older screenshots left the model's context; the
samples carry the reward and are token-exact; the judge outage on focus-text drops that
sample (not trainable, no reward); an honest failing policy is scored 0, a lying one fools
this judge (reward 1.0 against a failed task: the agreement report counts the false
positive), a mute one gets -1 after three malformed turns; no sandbox is left.
Needs the browser image (``make browser-image``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from orchard.recipes.gui.image import image_name

import orchard
from orchard.testing.scripted_model import scripted_upstream
from tests.recipes.gui.vlm_policies import CRASH, VlmPolicy, judge_policy
from tests.stack import IMAGES_DIR, REQUIRES_STACK, running_stack

pytestmark = [*REQUIRES_STACK, pytest.mark.timeout(600)]

GOOD = ["click-button", "click-link", "enter-text", "click-checkboxes", "focus-text"]


def _rows(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _not_blank(png: bytes) -> bool:
    """The PNG's pixel data (after inflating its IDAT chunks) holds more than a few values."""
    assert png.startswith(b"\x89PNG\r\n\x1a\n")
    pos, data = 8, b""
    while pos < len(png):
        length = int.from_bytes(png[pos : pos + 4], "big")
        kind = png[pos + 4 : pos + 8]
        if kind == b"IDAT":
            data += png[pos + 8 : pos + 8 + length]
        pos += 12 + length
    return len(set(zlib.decompress(data))) > 16


def _run(
    stack: Any, judge_url: str, out: Path, model: str, tasks: list[str], *extra: str
) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, "-m", "orchard.recipes.gui", "run", "--out", str(out), "--model", model,
         "--judge-url", judge_url, "--judge-model", "judge", "--miniwob", ",".join(tasks),
         "--max-steps", "8", "--concurrency", "2", "--seed", "3", *extra],
        env=stack.env, capture_output=True, text=True, timeout=400,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    return {r["task_id"]: r for r in _rows(out / "rollouts.jsonl")}


def _need_image() -> None:
    if not (IMAGES_DIR / image_name().replace(":", "+") / "image.json").is_file():
        pytest.fail(f"the browser image {image_name()} is not built: make browser-image")


def _no_sandbox_left(stack: Any, home: Path) -> None:
    key = (home / "dev-api-key").read_text().strip()
    with orchard.Orchard(stack.endpoint, key) as client:
        deadline = time.monotonic() + 30
        left = [s for s in client.sandboxes.list() if s.state != "deleting"]
        while left and time.monotonic() < deadline:
            time.sleep(0.2)
            left = [s for s in client.sandboxes.list() if s.state != "deleting"]
    assert left == [], left


@contextmanager
def _stack(home: Path, policy: VlmPolicy) -> Iterator[tuple[Any, Any, str]]:
    """The stack with the scripted VLM as its model upstream; the scripted judge beside it."""
    _need_image()
    with (
        scripted_upstream(policy) as (_, url),
        scripted_upstream(judge_policy) as (judge, judge_url),
        running_stack(home, up_args=["--model-upstream", url]) as stack,
    ):
        yield stack, judge, judge_url


def test_the_recipe_solves_miniwob_tasks_and_scores_failures(tmp_path: Path) -> None:
    policy = VlmPolicy()
    home = tmp_path / "home"
    with _stack(home, policy) as (stack, judge, judge_url):
        good = _run(stack, judge_url, tmp_path / "good", "good", GOOD)
        wrong = _run(stack, judge_url, tmp_path / "wrong", "wrong", ["click-button"])
        liar = _run(stack, judge_url, tmp_path / "liar", "liar", ["click-button"])
        mute = _run(stack, judge_url, tmp_path / "mute", "mute", ["click-button"])
        _no_sandbox_left(stack, home)

    # the good policy: every task solved by MiniWoB's own signal
    assert {t: r["truth_success"] for t, r in good.items()} == {f"miniwob/{n}": True for n in GOOD}
    assert {t: r["task_reward"] > 0 for t, r in good.items()} == {
        f"miniwob/{n}": True for n in GOOD
    }
    for name in GOOD[:4]:
        r = good[f"miniwob/{name}"]
        assert (r["status"], r["reward"], r["dropped"]) == ("completed", 1.0, None), r["fault"]
        assert r["reward_detail"]["stop_reason"] == "env_done"
        assert r["reward_detail"]["judge_success"] is True and r["reward_detail"]["format_ok"]
    assert good["miniwob/click-checkboxes"]["steps"] >= 4  # seed 3: three boxes, then Submit
    assert good["miniwob/enter-text"]["steps"] == 2
    # the judge outage: dropped, not zero
    focus = good["miniwob/focus-text"]
    assert (focus["status"], focus["reward"]) == ("aborted", None)
    assert focus["dropped"] and focus["dropped"].startswith("grade: JudgeFailed")
    assert "judge_failed" in focus["reward_detail"]
    # the model never had more than three screenshots; older ones were placeholders
    assert max(policy.seen_images) <= 3
    # samples: the reward on them, token-exact; the dropped rollout's are not trainable
    samples = _rows(tmp_path / "good" / "samples.rl.jsonl")
    by_rollout: dict[str, list[dict[str, Any]]] = {}
    for s in samples:
        by_rollout.setdefault(s["rollout_id"], []).append(s)
    assert set(by_rollout) == {f"miniwob/{n}#0" for n in GOOD}
    for rid, group in by_rollout.items():
        if rid.startswith("miniwob/focus-text"):
            assert all(not s["trainable"] for s in group)
        else:
            assert all(s["trainable"] and s["reward"] == 1.0 and s["token_exact"] for s in group), (
                rid
            )
            assert all(sum(s["loss_mask"]) > 0 for s in group)
    # the first three calls stitch into one sample; once a screenshot leaves the context
    # (k = 3) the history is rewritten and each later call is a branch of its own
    steps = good["miniwob/click-checkboxes"]["steps"]
    boxes = sorted(by_rollout["miniwob/click-checkboxes#0"], key=lambda s: s["sample_index"])
    assert [s["calls"] for s in boxes] == [[0, 1, 2]] + [[i] for i in range(3, steps)]
    assert [s["root"]["reason"] for s in boxes] == ["first"] + ["prefix_changed"] * (steps - 3)
    sft = _rows(tmp_path / "good" / "samples.sft.jsonl")
    assert {s["rollout_id"] for s in sft} == {f"miniwob/{n}#0" for n in GOOD[:4]}
    shots = sorted((tmp_path / "good" / "screenshots").glob("*.png"))
    assert len(shots) == 5  # the dropped rollout's too: they were taken before the judge failed
    assert all(_not_blank(p.read_bytes()) for p in shots)
    agreement = json.loads((tmp_path / "good" / "agreement.json").read_text())
    assert (agreement["n"], agreement["agreement"], agreement["skipped"]) == (
        4,
        1.0,
        {"judge_failed": 1},
    )

    # failing policies: scored as failing (-1 for a mute one), the liar fools this judge
    w = wrong["miniwob/click-button"]
    assert (w["status"], w["truth_success"], w["reward"]) == ("completed", False, 0.0)
    assert w["task_reward"] < 0 and w["reward_detail"]["judge_success"] is False
    lie = liar["miniwob/click-button"]
    assert (lie["truth_success"], lie["reward"], lie["reward_detail"]["judge_success"]) == (
        False,
        1.0,
        True,
    )
    m = mute["miniwob/click-button"]
    assert (m["status"], m["steps"], m["reward"]) == ("truncated", 3, -1.0)
    assert m["reward_detail"]["judge_skipped"] == "malformed_stop"

    # the agreement over every run: tp 4 (good), tn 1 (wrong), fp 1 (liar)
    combined = tmp_path / "all.jsonl"
    combined.write_text("".join((d / "rollouts.jsonl").read_text() for d in
                                (tmp_path / "good", tmp_path / "wrong", tmp_path / "liar", tmp_path / "mute")))  # fmt: skip
    report = json.loads(subprocess.run(
        [sys.executable, "-m", "orchard.recipes.gui", "agreement", str(combined)],
        capture_output=True, text=True, check=True, timeout=60,
    ).stdout)  # fmt: skip
    assert report["confusion"] | {} == {"tp": 4, "fp": 1, "fn": 0, "tn": 1, "rows": "judge",
                                        "columns": "ground truth"}  # fmt: skip
    assert report["kappa"] == pytest.approx(8 / 14)
    assert report["skipped"] == {"judge_failed": 1, "malformed_stop": 1}
    assert len(judge.requests) >= 6


def test_rounds_move_the_budget_and_a_browser_crash_aborts(tmp_path: Path) -> None:
    """``--rounds``: tasks drawn by the sampler, the budget from the curriculum (2 steps, then 4
    once two rounds agree); and a browser killed mid-episode is ABORTED, never scored."""
    policy = VlmPolicy()
    home = tmp_path / "home"
    with _stack(home, policy) as (stack, _, judge_url):
        key = (home / "dev-api-key").read_text().strip()

        def kill() -> None:
            with orchard.Orchard(stack.endpoint, key) as client:
                (info,) = [s for s in client.sandboxes.list() if s.state in ("ready", "claimed")]
                client.sandboxes.connect(info.id).exec(CRASH, timeout=30)

        policy.kill = kill
        out = tmp_path / "rounds"
        _run(stack, judge_url, out, "good", ["click-button", "click-link"], "--rounds", "3",
             "--batch", "2", "--curriculum", "2,4", "--stable-window", "2")  # fmt: skip
        crashed = _run(stack, judge_url, tmp_path / "crash", "crash", ["click-button"],
                       "--concurrency", "1")  # fmt: skip
        _no_sandbox_left(stack, home)

    rounds = _rows(out / "rounds.jsonl")
    assert [(r["budget"], r["graded"], r["successes"]) for r in rounds] == [
        (2, 2, 2),
        (2, 2, 2),
        (4, 2, 2),
    ]
    assert [r["switched"] for r in rounds] == [False, True, False]
    state = json.loads((out / "curriculum.json").read_text())
    assert state["curriculum"]["switches"] == [
        {"round": 2, "from": 2, "to": 4, "rates": [1.0, 1.0]}
    ]
    drawn = [t for r in rounds for t in r["drawn"]]
    assert set(drawn) <= {"miniwob/click-button", "miniwob/click-link"} and len(drawn) == 6
    assert sum(state["sampler"]["buckets"].values()) == 2
    assert len(_rows(out / "rollouts.jsonl")) == 6
    r = crashed["miniwob/click-button"]
    assert (r["status"], r["reward"]) == ("aborted", None)
    assert r["fault"].startswith("harness: browser: "), r["fault"]
    assert r["reward_detail"] == {}
    assert all(not s["trainable"] for s in _rows(tmp_path / "crash" / "samples.rl.jsonl"))


@pytest.mark.skipif(
    not os.environ.get("ORCHARD_TEST_GUI_JUDGE_URL"),
    reason="optional: ORCHARD_TEST_GUI_JUDGE_URL (and _MODEL, _KEY) name a real vision judge",
)
def test_a_real_judge_against_miniwob_ground_truth(tmp_path: Path) -> None:
    """The agreement of a real judge (any OpenAI-compatible vision model) with MiniWoB's
    signal, over the scripted policy's successes and honest failures; printed as JSON."""
    _need_image()
    judge_url = os.environ["ORCHARD_TEST_GUI_JUDGE_URL"]
    extra = ["--judge-model", os.environ.get("ORCHARD_TEST_GUI_JUDGE_MODEL", "judge")]
    if os.environ.get("ORCHARD_TEST_GUI_JUDGE_KEY"):
        extra += ["--judge-key", os.environ["ORCHARD_TEST_GUI_JUDGE_KEY"]]
    home = tmp_path / "home"
    with (
        scripted_upstream(VlmPolicy()) as (_, url),
        running_stack(home, up_args=["--model-upstream", url]) as stack,
    ):
        runs = {"good": GOOD[:4], "wrong": ["click-button", "click-link"]}
        for model, tasks in runs.items():
            _run(stack, judge_url, tmp_path / model, model, tasks, *extra)
    combined = tmp_path / "all.jsonl"
    combined.write_text("".join((tmp_path / m / "rollouts.jsonl").read_text() for m in runs))
    report = json.loads(subprocess.run(
        [sys.executable, "-m", "orchard.recipes.gui", "agreement", str(combined)],
        capture_output=True, text=True, check=True, timeout=60,
    ).stdout)  # fmt: skip
    print(json.dumps(report))
    assert report["n"] + sum(report["skipped"].values()) == 6
    assert report["truth_success_rate"] is None or 0 <= report["truth_success_rate"] <= 1
