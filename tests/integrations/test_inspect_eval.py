"""Real Inspect evals on ``sandbox="orchard"`` against a real stack: in process
(``inspect_ai.eval``, with ``max_sandboxes``) and through Inspect's own CLI
(``inspect eval``, ``inspect sandbox cleanup orchard``), where nothing of
orchard is imported by the user's code: the entry point finds the provider.
The model is Inspect's ``mockllm/model``; the scorer runs code in the sandbox.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from inspect_ai import eval as inspect_eval

from orchard import Orchard
from tests.stack import REQUIRES_STACK, Stack

pytestmark = [
    *REQUIRES_STACK,
    pytest.mark.timeout(240),
    # Inspect's own dependencies warn inside its eval loop (tenacity's "initial"
    # deprecation); the suite's warnings-as-errors would fail the eval on them.
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),
    # and leaves anyio memory streams of its own to the garbage collector.
    pytest.mark.filterwarnings(
        "ignore:Exception ignored in. <function MemoryObjectReceiveStream.__del__"
        ":pytest.PytestUnraisableExceptionWarning"
    ),
]

TASK = Path(__file__).with_name("inspect_task.py")
INSPECT = [sys.executable, "-m", "inspect_ai"]


def _live(task: str) -> list[str]:
    with Orchard() as client:
        infos = client.sandboxes.list({"inspect-ai/task": task})
    return [i.id for i in infos if i.state in ("pending", "ready", "claimed")]


def test_eval_scores_code_run_in_orchard_one_sandbox_at_a_time(
    stack: Stack, tmp_path: Path
) -> None:
    from tests.integrations.inspect_task import arithmetic_in_sandbox

    [log] = inspect_eval(
        arithmetic_in_sandbox(count_live=True),
        max_sandboxes=1,
        display="none",
        log_dir=str(tmp_path),
    )
    assert log.status == "success", log.error
    assert log.samples is not None
    scores = {s.id: s.scores["runs_in_sandbox"] for s in log.samples if s.scores}
    assert {k: (v.value, v.answer) for k, v in scores.items()} == {
        "six": ("C", "42"),
        "three": ("C", "21"),
        "wrong": ("I", "4"),
    }
    # The per-sample config reached its sandbox (env and memory); the others got defaults.
    assert (scores["six"].metadata["N"], scores["six"].metadata["memory"]) == ("6", 256 << 20)
    assert scores["three"].metadata["N"] == "unset"
    assert scores["three"].metadata["memory"] != 256 << 20
    # max_sandboxes=1: each sample saw its own sandbox alone.
    assert {v.metadata["live"] for v in scores.values()} == {1}
    assert _live("arithmetic_in_sandbox") == []  # sample_cleanup deleted each one


def test_inspect_cli_needs_no_import_and_keeps_sandboxes_when_asked(
    stack: Stack, tmp_path: Path
) -> None:
    env = {**os.environ, "INSPECT_LOG_DIR": str(tmp_path)}
    run = subprocess.run(
        [*INSPECT, "eval", TASK.name, "--no-sandbox-cleanup",
         "--display", "none", "--log-format", "json"],
        env=env, capture_output=True, text=True, timeout=180, cwd=TASK.parent,
    )  # fmt: skip
    assert run.returncode == 0, run.stdout + run.stderr
    [log_file] = tmp_path.glob("*.json")
    log = json.loads(log_file.read_text())
    assert log["status"] == "success"
    assert log["results"]["scores"][0]["metrics"]["accuracy"]["value"] == pytest.approx(2 / 3)
    kept = _live("arithmetic_in_sandbox")
    assert len(kept) == 3  # --no-sandbox-cleanup: every sample's sandbox is still there
    assert all(f"Kept Orchard sandbox {i}" in run.stdout + run.stderr for i in kept)

    cleanup = subprocess.run(
        [*INSPECT, "sandbox", "cleanup", "orchard", kept[0]],
        env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert cleanup.returncode == 0, cleanup.stderr
    assert sorted(_live("arithmetic_in_sandbox")) == sorted(kept[1:])
    cleanup_all = subprocess.run(
        [*INSPECT, "sandbox", "cleanup", "orchard"],
        env=env, capture_output=True, text=True, timeout=60, input="y\n",
    )  # fmt: skip
    assert cleanup_all.returncode == 0, cleanup_all.stderr
    assert _live("arithmetic_in_sandbox") == []
