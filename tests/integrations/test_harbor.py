"""Harbor (PyPI ``harbor``) runs its tasks on Orchard: its own CLI, its own agents and verifier.

Harbor needs Python >= 3.12 and the suite runs on 3.11, so Harbor lives in its own venv
(``.venv-harbor``, made by ``make harbor-venv``, which ``make test`` runs first) with
this package installed in it; these tests start a real stack and drive Harbor there:

- ``harbor run`` with Harbor's ``oracle`` agent on a small task with a verifier
  (``harbor_tasks/greeting``, in Harbor's task format; its verifier in the agent's
  sandbox and, in ``greeting-separate``, in a sandbox of its own) gets reward 1, and
  its ``nop`` agent gets reward 0: the environment really ran the solution and tests;
- ``harbor_checks.py``, run by pytest inside that venv, checks the backend's contract
  (exec, timeouts, files, Dockerfile refusal, image mapping, network policy, errors).
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.stack import REQUIRES_STACK, Stack, running_stack

from .side_venv import ROOT, requires_venv, run_checks, stack_env

HARBOR_VENV = ROOT / ".venv-harbor"
TASKS = Path(__file__).parent / "harbor_tasks"
# the same task twice: its verifier in the agent's sandbox ("shared"), and in a second
# sandbox that Harbor starts through this backend too, the answer copied over as an
# artifact ("separate", Harbor's recommended mode)
TASK_NAMES = ["greeting", "greeting-separate"]
IMPORT_PATH = "orchard.integrations.harbor:OrchardEnvironment"

pytestmark = [*REQUIRES_STACK, requires_venv(HARBOR_VENV, "harbor-venv")]


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    with running_stack(tmp_path_factory.mktemp("harbor") / "home") as running:
        yield running


def _harbor_run(stack: Stack, task: str, agent: str, jobs: Path) -> dict[str, object]:
    result = subprocess.run(
        [str(HARBOR_VENV / "bin" / "harbor"), "run", "--path", str(TASKS / task), "--agent", agent,
         "--env", IMPORT_PATH, "--jobs-dir", str(jobs), "--yes"],
        env=stack_env(stack), capture_output=True, text=True, timeout=240, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert result.returncode == 0, (result.stdout[-3000:], result.stderr[-3000:])
    [trial_result] = [p for p in jobs.glob("*/*/result.json")]
    trial = json.loads(trial_result.read_text())
    assert trial["exception_info"] is None, trial["exception_info"]
    return trial


@pytest.mark.parametrize("task", TASK_NAMES)
def test_oracle_solves_the_task_on_orchard(stack: Stack, tmp_path: Path, task: str) -> None:
    trial = _harbor_run(stack, task, "oracle", tmp_path / "jobs")
    assert trial["verifier_result"]["rewards"] == {"reward": 1.0}
    assert trial["config"]["environment"]["import_path"] == IMPORT_PATH


@pytest.mark.parametrize("task", TASK_NAMES)
def test_a_nop_agent_gets_no_reward(stack: Stack, tmp_path: Path, task: str) -> None:
    trial = _harbor_run(stack, task, "nop", tmp_path / "jobs")
    assert trial["verifier_result"]["rewards"] == {"reward": 0.0}


def test_the_backend_contract_under_harbor(stack: Stack) -> None:
    run_checks(HARBOR_VENV, Path(__file__).parent / "harbor_checks.py", stack)
