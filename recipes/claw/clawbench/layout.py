"""Where a claw-bench task lives in a sandbox, and the commands that set it up, solve it and
verify it there.

claw-bench's own runner (``claw_bench.core.runner.run_single_task``, what ``claw-bench run`` and
``claw-bench oracle`` use; its ``--sandbox`` flag only changes a banner) runs everything on the
host: ``bash environment/setup.sh <workspace>`` in the task folder, then copies
``environment/data/*`` into the workspace, sends the prompt, and runs
``pytest verifier/test_output.py --workspace=<workspace> --rootdir=<tasks root>``. Here the same
steps run in a sandbox of the default image, network ``none``:

- the task folder is ``/opt/claw-bench/tasks/<domain>/<task>/`` with only ``environment/`` in
  it while the agent works (the reference solution and the verifier are not there to read);
- the workspace is ``/workspace`` (the trial's workdir), and ``<task folder>/workspace`` links
  to it: 36 setup scripts write to ``$TASK_DIR/workspace`` whatever ``$1`` says, and three
  verifiers read ``$WORKSPACE`` or ``<verifier>/../workspace`` instead of ``--workspace`` (both
  were claw-bench's layout before its runner moved workspaces to ``workspace/<run id>``);
- the reference solution is written to ``<task folder>/solution/solve.sh`` by its own command
  (a quoted here-document) and run as ``bash solve.sh /workspace``;
- the verifier (``verifier/`` and the root ``conftest.py``) is written only when grading, and
  runs under the image's ``python3 -P`` (the agent's folder is not put on ``sys.path``: a
  ``/workspace/json.py`` cannot stand in for the standard library) with plugin autoload off;
  :mod:`.in_sandbox.junit_score` turns its JUnit report into the score line;
- ``python`` is ``python3``: 62 reference solutions run ``python - <<EOF`` (claw-bench's runner
  runs on a host, its Docker image is ``python:3.12-slim``; both have ``python``), and Debian's
  image has only ``python3``. The setup links ``/usr/local/bin/python`` to it when the image has
  no ``python``, which is all Debian's ``python-is-python3`` package does. Nothing else is added
  to the image: a task that needs a module it lacks (``yaml``, ``requests``) is refused.
"""

from __future__ import annotations

import hashlib
import re
import shlex
from importlib import resources

from .source import BenchTask

TASKS_DIR = "/opt/claw-bench/tasks"
WORKSPACE = "/workspace"
VERIFY_DIR = "/opt/claw-bench/verify"
SCORE_SCRIPT = f"{VERIFY_DIR}/junit_score.py"
VERIFIER_TIMEOUT = 120
"""Seconds for the verifier's pytest run (claw-bench's ``verify_task`` allows 120)."""
PYTHON_LINK = (
    'command -v python >/dev/null 2>&1 || ln -s "$(command -v python3)" /usr/local/bin/python'
)
_WORKSPACE_REF = re.compile(r"(?<![\w/.-])workspace/")


def task_dir(task: BenchTask) -> str:
    return f"{TASKS_DIR}/{task.rel}"


def prompt(task: BenchTask) -> str:
    """The prompt claw-bench's runner sends (``run_single_task``): its three-line preamble, then
    ``instruction.md`` with each relative ``workspace/`` made ``/workspace/`` (claw-bench
    replaces every ``workspace/``, also inside an absolute path; here only relative ones)."""
    instruction = _WORKSPACE_REF.sub(f"{WORKSPACE}/", task.instruction)
    return (
        f"IMPORTANT: You must write all output files to the absolute path: {WORKSPACE}/\n"
        "Do NOT use relative paths. Use the exact absolute path above.\n"
        "Execute shell commands to create the required files.\n\n"
        f"{instruction}"
    )


def environment_files(task: BenchTask) -> dict[str, bytes]:
    """What is written into the agent's sandbox before setup: ``environment/`` only."""
    return {f"{task_dir(task)}/{path}": data for path, data in task.environment.items()}


def setup_commands(task: BenchTask) -> list[str]:
    """claw-bench's setup, in the order its runner does it (run in ``/workspace``)."""
    here = shlex.quote(task_dir(task))
    commands = [
        PYTHON_LINK,
        f"ln -sfn {WORKSPACE} {here}/workspace",
        f"cd {here} && bash environment/setup.sh {WORKSPACE}",
    ]
    if task.has_data:
        commands.append(f"cp -a {here}/environment/data/. {WORKSPACE}/")
    return commands


def _heredoc(path: str, text: str) -> str:
    """``cat > path`` fed ``text`` by a quoted here-document whose end word is not in ``text``."""
    word = "CLAW_BENCH_EOF_" + hashlib.sha256(text.encode()).hexdigest()[:16]
    if word in text:  # a collision is not a plausible accident; refuse it rather than break
        raise ValueError(f"{path}: its text contains the here-document's end word {word}")
    body = text if text.endswith("\n") else text + "\n"
    return f"cat > {shlex.quote(path)} <<'{word}'\n{body}{word}\n"


def oracle_command(task: BenchTask) -> str:
    """The reference solution as one shell command: write ``solve.sh``, run it on /workspace."""
    solution = f"{task_dir(task)}/solution"
    return (
        f"mkdir -p {shlex.quote(solution)}\n"
        + _heredoc(f"{solution}/solve.sh", task.solution)
        + f"bash {shlex.quote(solution)}/solve.sh {WORKSPACE}\n"
    )


def score_script() -> bytes:
    return resources.files(__package__).joinpath("in_sandbox/junit_score.py").read_bytes()


def verifier_files(task: BenchTask) -> dict[str, bytes]:
    """Written only when grading: the verifier folder, the root conftest, the score script."""
    files = {f"{task_dir(task)}/{path}": data for path, data in task.verifier.items()}
    files[f"{TASKS_DIR}/conftest.py"] = task.conftest
    files[SCORE_SCRIPT] = score_script()
    return files


def verifier_command(task: BenchTask, timeout: int = VERIFIER_TIMEOUT) -> str:
    """Run the verifier on /workspace; the last line of its output is the score JSON."""
    here = shlex.quote(task_dir(task))
    junit, output = f"{VERIFY_DIR}/junit.xml", f"{VERIFY_DIR}/pytest.txt"
    return (
        f"{PYTHON_LINK}\n"
        f"ln -sfn {WORKSPACE} {here}/workspace\n"
        f"rm -f {junit} {output}\n"
        f"cd {here} && WORKSPACE={WORKSPACE} PYTHONDONTWRITEBYTECODE=1"
        " PYTEST_DISABLE_PLUGIN_AUTOLOAD=1"
        f" timeout -k 5 {int(timeout)} python3 -P -m pytest -q -p no:cacheprovider"
        f" --rootdir={TASKS_DIR} --junitxml={junit} verifier/test_output.py"
        f" --workspace={WORKSPACE} > {output} 2>&1\n"
        f"python3 -P {SCORE_SCRIPT} {junit} {output} $?\n"
    )
