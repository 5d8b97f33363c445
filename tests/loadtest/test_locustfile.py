"""The Locust harness end to end: a real ``orchard up``, real Locust, real runc sandboxes.

- ``run_locust.run`` with 5 users: Locust's CSV and the JSON summary name the six
  operations, each with 5 requests and no failure, the run stops by itself,
  the liveness probe answered, and nothing is left behind.
- The interceptor in a separate process (Locust monkey-patches the standard
  library on import, which must not happen inside pytest): a command whose
  exit code is wrong is reported to Locust as a failed request.
- The checks and the summary's phase arithmetic, in-process (no Locust there).
"""

from __future__ import annotations

import csv
import json
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import pytest

from loadtest import run_locust
from loadtest.locust_checks import COMMANDS, ls_check, output_check
from loadtest.locust_summary import phase_times
from orchard import ExecResult, ExecStatus
from tests.stack import REQUIRES_STACK, running_stack

ROOT = Path(__file__).resolve().parents[2]
OPERATIONS = {"create", "delete", *(name for name, _, _ in COMMANDS)}
F = TypeVar("F", bound=Callable[..., None])


def needs_stack(test: F) -> F:
    for mark in REQUIRES_STACK:
        test = mark(test)
    return test


def result(code: int, out: str) -> ExecResult:
    return ExecResult(code, out.encode(), b"", ExecStatus(code))


def test_checks_fail_on_a_wrong_exit_code_or_output() -> None:
    python = output_check("Python 3.")
    assert python(result(0, "Python 3.11.2 (main)\n")) is None
    assert "exit code 1" in (python(result(1, "Python 3.11.2\n")) or "")
    assert "does not start" in (python(result(0, "Traceback ...\n")) or "")
    assert ls_check(result(0, "bin\netc\nusr\ntmp\nvar\n")) is None
    assert "lacks" in (ls_check(result(0, "bin\n")) or "")


def test_phase_times_need_every_user_to_finish_a_phase() -> None:
    marks = [
        {"start": 100.0, "created": 101.0, "executed": 103.0, "deleted": 104.0, "end": 104.0},
        {"start": 100.5, "created": 102.0, "end": 102.5, "ok": False},
    ]
    phases = phase_times(marks)
    assert phases["all_created_s"] == 2.0
    assert phases["all_executed_s"] is None  # one user never got there
    assert phases["wall_s"] == 4.0
    assert phases["users_ok"] == 0


@needs_stack
@pytest.mark.parametrize("mode", ["cold", "warm"])
@pytest.mark.timeout(240)
def test_locust_run_reports_six_operations_all_successful(tmp_path: Path, mode: str) -> None:
    out = tmp_path / "out"
    summary = run_locust.run(
        5, mode, out, run_time=120, probe_interval=1.0, drain=1.0, idle=mode == "cold"
    )
    assert summary["locust_exit_code"] == 0, (out / "locust.log").read_text()[-2000:]
    assert set(summary["operations"]) == OPERATIONS
    for name, stats in summary["operations"].items():
        assert (stats["requests"], stats["failures"]) == (5, 0), (name, stats)
    assert summary["success_rate"] == 1.0
    assert summary["phases"]["all_deleted_s"] is not None
    assert summary["locust_process_s"] < 100  # stopped by itself, long before --run-time
    with (out / "locust_stats.csv").open() as src:
        rows = {row["Name"]: row for row in csv.DictReader(src)}
    assert set(rows) >= OPERATIONS
    assert all(rows[name]["Failure Count"] == "0" for name in OPERATIONS)
    assert (out / "locust.html").stat().st_size > 0
    probe = summary["liveness_probe"]
    assert probe["probes"] >= 1 and probe["failed"] == 0, probe
    assert summary["nothing_left_after_stop"], summary["left_after_stop"]
    assert summary["left_after_stop"]["store_rows"].get("deleted", 0) >= 6
    idle = summary["idle_memory"]["per_sandbox"]
    assert idle["sandboxes"] == 5 and idle["processes_per_sandbox"] >= 1
    assert 0 < idle["pss_mib"] < 64
    assert json.loads((out / "summary.json").read_text())["users"] == 5


INTERCEPTED = textwrap.dedent(
    """
    import json, sys
    sys.path.insert(0, sys.argv[1])
    from locust.env import Environment
    from loadtest.locust_checks import output_check
    from loadtest.locust_interceptor import LocustInterceptor, operation
    from orchard import Orchard

    env = Environment()
    seen = []
    env.events.request.add_listener(
        lambda name, response_time, response_length, exception, **_: seen.append(
            [name, response_time, response_length, type(exception).__name__ if exception else None]
        )
    )
    client = Orchard(interceptors=[LocustInterceptor(env)])
    sandbox = client.sandboxes.create(network="none")
    with operation("exec false", output_check("")):
        sandbox.exec(["false"])
    with operation("exec echo", output_check("hi")):
        sandbox.exec(["echo", "hi"])
    sandbox.delete()
    print(json.dumps(seen))
    """
)


@needs_stack
@pytest.mark.timeout(120)
def test_interceptor_reports_each_call_and_a_wrong_answer_as_a_failure(tmp_path: Path) -> None:
    with running_stack(tmp_path / "home") as stack:
        env = {
            **stack.env,
            "ORCHARD_ENDPOINT": stack.endpoint,
            "ORCHARD_API_KEY": (stack.home / "dev-api-key").read_text().strip(),
        }
        done = subprocess.run(
            [sys.executable, "-c", INTERCEPTED, str(ROOT)],
            env=env,
            capture_output=True,
            text=True,
            timeout=90,
        )
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout.splitlines()[-1])
    names = [(name, error) for name, _, _, error in seen]
    assert names == [
        ("CreateSandbox", None),
        ("exec false", "WrongAnswer"),
        ("exec echo", None),
        ("DeleteSandbox", None),
    ]
    assert all(ms > 0 for _, ms, _, _ in seen)
    assert seen[2][2] > 0  # the response's length
