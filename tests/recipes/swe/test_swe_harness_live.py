"""The SWE recipe's one command with a real harness of the tools layer instead of the built-in
loop: ``python -m orchard.recipes.swe run --harness mini-swe-agent`` on the calc_divide sample.

mini-swe-agent (the PyPI package, from the tools layer) runs inside the rollout's sandbox and
calls the model through the sandbox's model endpoint, which the node relays to ``orchard up``'s
recording proxy; the model is a scripted upstream (a real HTTP server following a policy); the
grade is the rewards service's SWE grader. Needs the tools layer (``make tools-layer``).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from orchard.recipes.swe.cli import SAMPLES

from orchard.testing.scripted_model import scripted_upstream
from tests.recipes.swe.policies import FIX_CALC, commands
from tests.stack import REQUIRES_STACK, TOOLS_DIR, running_stack

pytestmark = [
    *REQUIRES_STACK,
    pytest.mark.timeout(600),
    pytest.mark.skipif(
        not any(TOOLS_DIR.glob("harnesses-*/layer.json")),
        reason=f"no tools layer under {TOOLS_DIR} (make tools-layer)",
    ),
]

CALC = "orchard-samples__calc_divide-1"


def _rows(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def test_the_recipe_runs_a_tools_layer_harness(tmp_path: Path) -> None:
    policy = commands(["cat calc/__init__.py", FIX_CALC])  # then it submits (the sentinel)
    out = tmp_path / "run"
    with (
        scripted_upstream(policy) as (upstream, url),
        running_stack(tmp_path / "home", up_args=["--model-upstream", url]) as stack,
    ):
        done = subprocess.run(
            [sys.executable, "-m", "orchard.recipes.swe", "run", "--out", str(out),
             "--tasks", str(SAMPLES), "--only", CALC, "--model", "scripted", "--harness", "mini-swe-agent",
             "--memory", "2Gi", "--max-steps", "6", "--no-rerank"],
            env=stack.env, capture_output=True, text=True, timeout=480,
        )  # fmt: skip
        assert done.returncode == 0, done.stdout + done.stderr
        bodies = list(upstream.requests)
    [rollout] = _rows(out / "rollouts.jsonl")
    assert (rollout["harness"], rollout["status"], rollout["resolved"]) == (
        "mini-swe-agent",
        "completed",
        True,
    ), rollout.get("fault")
    assert rollout["reward"] == 1.0
    assert "len(values)" in rollout["diff"]
    # mini-swe-agent's own requests reached the upstream (its bash tool, its system prompt)
    assert bodies and all(
        any(t["function"]["name"] == "bash" for t in b.get("tools") or []) for b in bodies
    )
    samples = _rows(out / "samples.rl.jsonl")
    assert samples and all(s["reward"] == 1.0 and s["trainable"] for s in samples)
    assert _rows(out / "samples.sft.jsonl")  # resolved: its samples are SFT data too
