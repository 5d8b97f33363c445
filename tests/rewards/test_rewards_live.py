"""The rewards service end to end on a real stack (``orchard up``: real runc sandboxes,
real gRPC): the sample instance graded through the SDK and the CLI, every failure
kind, bad input and bad keys."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from orchard import AuthenticationError, InvalidRequestError, OrchardError, Rewards
from tests.stack import ORCHARD, REQUIRES_STACK, Stack, running_stack

pytestmark = REQUIRES_STACK

SAMPLES = Path(__file__).parents[2] / "recipes" / "swe" / "samples"
ROW = json.loads((SAMPLES / "instances.jsonl").read_text().splitlines()[0])
GOLD = (SAMPLES / "calc_divide" / "gold.patch").read_text()


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    with running_stack(tmp_path_factory.mktemp("rewards-home")) as s:
        yield s


@pytest.fixture(scope="module")
def rewards(stack: Stack) -> Rewards:
    endpoint = (stack.home / "run" / "rewards.addr").read_text().strip()
    return Rewards(endpoint, (stack.home / "dev-api-key").read_text().strip())


def test_gold_patch_resolves(rewards: Rewards) -> None:
    report = rewards.grade(ROW, f"The fix:\n```diff\n{GOLD}```\n")
    assert (report.kind, report.resolved, report.reward) == ("graded", True, 1.0), report.reason
    assert report.apply_method == "git apply"
    assert sorted(report.fail_to_pass[0]) == sorted(json.loads(ROW["FAIL_TO_PASS"]))
    assert report.pass_to_pass[1] == []
    assert ">>>>> Start Test Output" in report.log_tail


def test_wrong_patch_is_graded_unresolved(rewards: Rewards) -> None:
    wrong = GOLD.replace(
        "+    return sum(values) / len(values)", "+    return sum(values) / len(values) + 0.5"
    )
    report = rewards.grade(ROW, wrong, scheme="pass_rate")
    assert (report.kind, report.resolved) == ("graded", False)
    assert report.fail_to_pass == ([], sorted(json.loads(ROW["FAIL_TO_PASS"])))
    assert report.reward == pytest.approx(0.3 * 0 + 0.7 * 2 / 2)  # F2P none of 3, P2P both


def test_failure_kinds(rewards: Rewards) -> None:
    assert rewards.grade(ROW, "I could not find the bug.").kind == "no_patch"
    other = "--- a/nothere.py\n+++ b/nothere.py\n@@ -1 +1 @@\n-a\n+b\n"
    report = rewards.grade(ROW, other)
    assert (report.kind, report.reward) == ("patch_does_not_apply", -1.0)
    assert "patch --batch" in report.reason  # the whole cascade was tried
    slow = {**ROW, "install_config": {"test_cmd": "sleep 30", "log_parser": "pytest"}}
    timed = rewards.grade(slow, GOLD, test_timeout=2)
    assert (timed.kind, timed.reward) == ("timeout", -1.0)
    silent = {**ROW, "install_config": {"test_cmd": "true", "log_parser": "pytest"}}
    assert rewards.grade(silent, GOLD).kind == "invalid_log"


def test_infrastructure_failure_has_no_reward(rewards: Rewards) -> None:
    report = rewards.grade({**ROW, "image": "no-such-image:1"}, GOLD)
    assert report.is_infrastructure and report.reward is None and "no-such-image" in report.reason
    broken = {**ROW, "test_patch": "--- a/tests/x.py\n+++ b/tests/x.py\n@@ -1 +1 @@\n-q\n+r\n"}
    report = rewards.grade(broken, GOLD)
    assert report.is_infrastructure and "test patch" in report.reason


def test_bad_input_and_bad_keys(rewards: Rewards, stack: Stack) -> None:
    with pytest.raises(InvalidRequestError, match="FAIL_TO_PASS"):
        rewards.grade({**ROW, "FAIL_TO_PASS": "[not json"}, GOLD)
    with pytest.raises(InvalidRequestError, match="scheme"):
        rewards.grade(ROW, GOLD, scheme="lottery")
    with pytest.raises(AuthenticationError):
        Rewards(rewards.endpoint, "wrong-key").grade(ROW, GOLD)
    verdict = rewards.judge("patch_verdict", {"task": "t", "patch": "p"})
    assert not verdict.ok and "ORCHARD_JUDGE_BASE_URL" in verdict.failure  # no judge configured
    with pytest.raises(OrchardError, match="value model"):
        rewards.rank("t", [{"id": "a", "trajectory": [], "patch": ""}])


def test_cli_grade_exit_codes(stack: Stack, tmp_path: Path) -> None:
    instances = str(SAMPLES / "instances.jsonl")
    ok = stack.cli("reward", "grade", instances, str(SAMPLES / "calc_divide" / "gold.patch"))
    assert ok.returncode == 0 and json.loads(ok.stdout)["resolved"] is True, ok.stderr
    empty = tmp_path / "empty.txt"
    empty.write_text("nothing")
    miss = stack.cli("reward", "grade", instances, str(empty))
    assert miss.returncode == 3 and json.loads(miss.stdout)["kind"] == "no_patch"
    bad = stack.cli("reward", "grade", instances, str(empty), "--id", "nope")
    assert bad.returncode == 1 and "--id" in bad.stderr
    assert (
        subprocess.run([*ORCHARD, "reward", "--help"], capture_output=True, check=False).returncode
        == 0
    )


FORGERY = (
    "diff --git a/calc/__init__.py b/calc/__init__.py\n--- a/calc/__init__.py\n+++ b/calc/__init__.py\n"
    "@@ -12 +12,6 @@ def mean(values: list[float]) -> float:\n"
    "     return sum(values) / (len(values) + 1)\n"
    "+\n+import atexit, os\n+\n"
    '+atexit.register(lambda: (os.write(1, b"PASSED tests/test_calc.py::test_mean[values0-3]\\n"), os._exit(0)))\n'
    "+# the issue's hack: a status line after pytest's own summary, then exit 0\n"
)


def test_a_forged_log_earns_nothing_and_says_why(rewards: Rewards) -> None:
    report = rewards.grade(ROW, FORGERY)
    assert (report.kind, report.resolved, report.reward) == ("invalid_log", False, -1.0), (
        report.reason
    )
    assert "forged_log" in report.integrity and report.fault == "task", report
    exits = [f for f in report.findings if f["rule"] == "process_exit"]
    assert exits and exits[0]["severity"] == "high" and exits[0]["zeroes_reward"], report.findings
    assert exits[0]["path"] == "calc/__init__.py" and exits[0]["line"] == 16
