"""The CLI's offline commands as a user runs them: ``filter`` over WebGym-style rows (the
embedding stage off here: test_dedup_minilm.py runs it) and ``agreement`` over a run's
rollouts; ``run`` refuses to start without a judge."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

FIXTURES = Path(__file__).parent / "fixtures"
CLI = [sys.executable, "-m", "orchard.recipes.gui"]


def test_filter_writes_the_kept_rows_and_the_report(tmp_path: Path) -> None:
    done = subprocess.run(
        [*CLI, "filter", "--tasks", str(FIXTURES / "webgym_train.jsonl"),
         "--eval", str(FIXTURES / "webgym_eval.jsonl"), "--ranks", str(FIXTURES / "ranks.csv"),
         "--max-per-site", "2", "--no-dedup", "--out", str(tmp_path)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    kept = [json.loads(line) for line in (tmp_path / "kept.jsonl").read_text().splitlines()]
    assert [r["task_id"] for r in kept] == ["t3", "t6", "t7"]
    assert kept[0]["evaluator_reference"][1]["facts"][1] == "late opening noted"  # rows as read
    report = json.loads((tmp_path / "filter_report.json").read_text())
    assert [(s["stage"], s["in"], s["out"]) for s in report["stages"]] == [
        ("eval_overlap", 12, 8), ("subordinate", 8, 6), ("benchmark_sites", 6, 4),
        ("site_popularity", 4, 3),
    ]  # fmt: skip
    assert "eval_overlap" in done.stdout and "same_instruction 2" in done.stdout


def test_filter_names_the_bad_row(tmp_path: Path) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"task_id": "a", "task_name": "x", "website": "a.com"}\n{"task_id": "b"}\n')
    done = subprocess.run([*CLI, "filter", "--tasks", str(bad), "--no-dedup", "--out", str(tmp_path)],
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    assert done.returncode != 0
    assert f"filter: {bad}: row 2: task_name: Field required" in done.stderr


def test_agreement_reads_a_runs_rollouts(tmp_path: Path) -> None:
    rows = [{"status": "completed", "reward_detail": {"judge_success": j, "truth_success": t}}
            for j, t in [(True, True), (True, False), (False, False), (False, False)]]  # fmt: skip
    path = tmp_path / "rollouts.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    done = subprocess.run(
        [*CLI, "agreement", str(path)], capture_output=True, text=True, timeout=60
    )
    report = json.loads(done.stdout)
    assert (report["n"], report["agreement"], report["confusion"]["fp"]) == (4, 0.75, 1)
    assert abs(report["kappa"] - 0.5) < 1e-9


def test_run_needs_a_judge(tmp_path: Path) -> None:
    done = subprocess.run([*CLI, "run", "--out", str(tmp_path), "--model", "m"],
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    assert done.returncode != 0 and "--judge-url and --judge-model are required" in done.stderr
    done = subprocess.run([*CLI, "run", "--out", str(tmp_path), "--model", "m", "--judge-url", "u",
                           "--judge-model", "j", "--miniwob", "no-such-task"],
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    assert done.returncode != 0 and "unknown task(s) ['no-such-task']" in done.stderr
