"""mini-swe-agent's ``Environment`` contract on a real Orchard sandbox, its
``DefaultAgent`` + ``DeterministicModel`` on a real git repository (the same
recorded trajectory in mini-swe-agent's own ``LocalEnvironment``, observations
compared), and its ``mini`` CLI loading the environment by import path.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

# mini-swe-agent writes a global config dir and prints a banner at import.
os.environ.setdefault("MSWEA_GLOBAL_CONFIG_DIR", tempfile.mkdtemp(prefix="mswea-"))
os.environ.setdefault("MSWEA_SILENT_STARTUP", "1")

import pytest
import yaml
from minisweagent.agents.default import DefaultAgent
from minisweagent.environments import get_environment
from minisweagent.environments.local import LocalEnvironment
from minisweagent.exceptions import Submitted
from minisweagent.models.test_models import DeterministicModel, make_output

import orchard
from orchard.integrations.minisweagent import OrchardEnvironment
from tests.stack import REQUIRES_STACK, Stack

pytestmark = [*REQUIRES_STACK, pytest.mark.timeout(180)]

IMPORT_PATH = "orchard.integrations.minisweagent.OrchardEnvironment"
AGENT_CONFIG = yaml.safe_load(
    (Path(sys.modules["minisweagent"].__file__).parent / "config" / "default.yaml").read_text()  # type: ignore[arg-type]
)["agent"]

# A recorded trajectory on a small real repository with a real bug: the agent
# makes the repo, runs the failing check, reads the code, fixes it, runs the
# check again, hits a timeout, and submits its diff. Only relative paths, so it
# means the same in a host temp dir and in the sandbox. `python3 -B`: the fix keeps
# calc.py's size and lands in the same second, which a cached .pyc cannot tell.
TRAJECTORY = [
    "git -c init.defaultBranch=main init -q . && git config user.email a@b.c && git config user.name t"
    " && printf 'def add(a, b):\\n    return a - b\\n' > calc.py"
    " && printf 'import calc, sys\\nr = calc.add(2, 3)\\nprint(\"add(2, 3) =\", r)\\nsys.exit(r != 5)\\n' > check.py"
    " && git add . && git commit -qm init && git log --format=%s",
    "python3 -B check.py",
    "cat -n calc.py; echo to-stderr >&2; echo to-stdout",
    "sed -i 's/a - b/a + b/' calc.py && git diff",
    "python3 -B check.py && exit 3",
    "echo started; sleep 30",
    "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT && git diff --stat",
]


def _model() -> DeterministicModel:
    return DeterministicModel(
        outputs=[make_output(f"step {i}", [{"command": c}]) for i, c in enumerate(TRAJECTORY)]
    )


def _run(env: Any) -> tuple[dict[str, Any], list[str]]:
    agent = DefaultAgent(_model(), env, **{**AGENT_CONFIG, "step_limit": 0, "cost_limit": 0})
    result = agent.run("make add() add")
    observations = [m["content"] for m in agent.messages if m["role"] == "user"][1:]
    return result, observations


@pytest.fixture
def env(stack: Stack) -> Any:
    with OrchardEnvironment(cwd="/", timeout=10) as e:
        yield e


def test_trajectory_observations_match_local_environment(stack: Stack, tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    repo.mkdir()
    local_result, local_obs = _run(LocalEnvironment(cwd=str(repo), timeout=2))
    remote = get_environment({"environment_class": IMPORT_PATH, "cwd": "/work", "timeout": 2})
    assert isinstance(remote, OrchardEnvironment)
    try:
        remote.sandbox.exec(["mkdir", "-p", "/work"])
        remote_result, remote_obs = _run(remote)
    finally:
        remote.cleanup()
    assert len(remote_obs) == len(TRAJECTORY) - 1  # the last step submits
    assert remote_obs == local_obs
    assert remote_result == local_result
    assert local_result["exit_status"] == "Submitted"
    assert " calc.py | 2 +-" in local_result["submission"]
    assert "add(2, 3) = -1" in remote_obs[1] and "<returncode>1</returncode>" in remote_obs[1]
    assert "to-stderr\nto-stdout" in remote_obs[2]  # one stream, in write order
    assert "TimeoutExpired" not in remote_obs[5] and "timed out after 2 seconds" in remote_obs[5]
    # the sandbox is gone with cleanup()
    assert orchard.Orchard().sandboxes.connect(remote.sandbox.id).last_info.state in (
        "deleting",
        "deleted",
    )


def test_execute_contract(env: OrchardEnvironment) -> None:
    out = env.execute({"command": "echo a; echo b >&2; echo c; exit 4"})
    assert out == {"output": "a\nb\nc\n", "returncode": 4, "exception_info": ""}
    assert env.execute({"command": "pwd"}, cwd="/tmp")["output"] == "/tmp\n"
    assert env.execute({"command": "kill -TERM $$"})["returncode"] == -15  # as subprocess says

    marker = "mswea-timeout-marker"
    command = f"echo before; bash -c 'sleep 60; : {marker}' & sleep 60"
    out = env.execute({"command": command}, timeout=1)
    expired = subprocess.TimeoutExpired(command, 1)
    assert out == {
        "output": "before\n",
        "returncode": -1,
        "exception_info": f"An error occurred while executing the command: {expired}",
        "extra": {"exception_type": "TimeoutExpired", "exception": str(expired)},
    }
    left = env.execute({"command": f"ps -eo args | grep '{marker}' | grep -v grep || true"})
    assert left["output"] == ""  # the timeout killed the whole tree, the background child too

    with pytest.raises(Submitted) as submitted:
        env.execute({"command": "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT; echo my answer"})
    assert submitted.value.messages[0]["extra"] == {
        "exit_status": "Submitted",
        "submission": "my answer\n",
    }
    # the sentinel with a failing command is not a submission
    assert (
        env.execute({"command": "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT; false"})["returncode"]
        == 1
    )


def test_template_vars_and_serialize(env: OrchardEnvironment) -> None:
    tv = env.get_template_vars(extra_var=1)
    assert tv["system"] == "Linux" and tv["extra_var"] == 1 and tv["timeout"] == 10
    assert tv["release"] == os.uname().release  # the sandbox shares the host's kernel
    assert tv["node"] == env.sandbox.exec("uname -n").stdout_text.strip()
    data = env.serialize()["info"]["config"]
    assert data["environment_type"] == IMPORT_PATH.replace(
        "minisweagent.OrchardEnvironment", "minisweagent._environment.OrchardEnvironment"
    )
    assert data["environment"]["timeout"] == 10 and data["orchard_sandbox_id"] == env.sandbox.id
    json.dumps(env.serialize())


def test_lost_sandbox_is_not_an_observation(stack: Stack) -> None:
    env = OrchardEnvironment()
    with orchard.Orchard() as client:
        client.sandboxes.delete(env.sandbox.id)
        # the delete answers at "deleting"; the container goes right after
        deadline = time.monotonic() + 30
        while client.sandboxes.connect(env.sandbox.id).last_info.state != "deleted":
            assert time.monotonic() < deadline
            time.sleep(0.1)
    with pytest.raises(orchard.OrchardError) as err:
        env.execute({"command": "echo hi"})
    assert err.value.fault == "infrastructure" or isinstance(err.value, orchard.SandboxError)
    env.cleanup()


def test_mini_cli_loads_the_environment_by_import_path(stack: Stack, tmp_path: Path) -> None:
    config = {
        "environment": {"environment_class": IMPORT_PATH, "cwd": "/tmp"},
        "model": {
            "model_class": "minisweagent.models.test_models.DeterministicModel",
            "model_name": "deterministic",
            "outputs": [
                make_output("look", [{"command": "uname -s && pwd"}]),
                make_output(
                    "done", [{"command": "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT; hostname"}]
                ),
            ],
        },
    }
    (tmp_path / "orchard.yaml").write_text(yaml.safe_dump(config))
    trajectory = tmp_path / "traj.json"
    run = subprocess.run(
        [sys.executable, "-m", "minisweagent.run.mini", "-c", "default.yaml", "-c",
         str(tmp_path / "orchard.yaml"), "-t", "say where you are", "-y", "--exit-immediately",
         "-o", str(trajectory)],
        env={**os.environ, "MSWEA_CONFIGURED": "true"}, capture_output=True, text=True,
        timeout=120, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert run.returncode == 0, run.stdout + run.stderr
    data = json.loads(trajectory.read_text())
    info = data["info"]
    assert info["exit_status"] == "Submitted"
    sandbox_id = info["config"]["orchard_sandbox_id"]
    assert info["submission"] == f"{sandbox_id}\n"  # the sandbox's hostname is its id
    # mini never calls cleanup(): the environment's finaliser deleted the sandbox at exit
    state = orchard.Orchard().sandboxes.connect(sandbox_id).last_info.state
    assert state in ("deleting", "deleted")
    observation = [m for m in data["messages"] if m["role"] == "user"][1]["content"]
    assert "Linux\n/tmp" in observation
