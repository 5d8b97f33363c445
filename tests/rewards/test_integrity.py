"""The anti-hacking checks without a sandbox: the witness record, the runners' completion
records on the real corpus logs (honest: no alarm; tampered: caught), the static gate,
the test-infrastructure rules and the per-dataset policy. The same checks run end to
end in real sandboxes in ``test_adversarial_live.py``."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
from orchard.rewards.swe.completion import RunEvidence, check_completion
from orchard.rewards.swe.diff_gate import scan_patch
from orchard.rewards.swe.grading import END_MARKER, START_MARKER, read_log
from orchard.rewards.swe.instance import InstanceError, parse_instance
from orchard.rewards.swe.policy import RewardPolicy, parse_policy
from orchard.rewards.swe.test_files import infrastructure_reason
from orchard.rewards.swe.test_files import test_config_changed as config_changed
from orchard.rewards.swe.witness import (
    FORGED_LOG,
    RUNNER_INCOMPLETE,
    WITNESS_PREFIX,
    WitnessViolation,
    read_witnessed,
)

LOGS = Path(__file__).parent / "corpus" / "logs"
MANIFEST = json.loads((Path(__file__).parent / "corpus" / "instances.json").read_text())
CORPUS_RUNS = [  # (log, parser, manifest entry)
    ("six_fixed.log", "pytest", "six"), ("six_buggy.log", "pytest", "six"),
    ("django_fixed.log", "django", "django"), ("django_buggy.log", "django", "django"),
    ("more_itertools_fixed.log", "unittest", "more_itertools"),
    ("more_itertools_buggy.log", "unittest", "more_itertools"),
    ("sympy_fixed.log", "sympy", "sympy"), ("sympy_buggy.log", "sympy", "sympy"),
    ("edge_rA.log", "pytest", None), ("edge_rA_verbose.log", "pytest_v2", None),
]  # fmt: skip


def _evidence(log: str, parser: str, entry: str | None) -> RunEvidence:
    verdict = read_log(log, parser)
    ids = (
        MANIFEST[entry]["FAIL_TO_PASS"] + MANIFEST[entry]["PASS_TO_PASS"]
        if entry
        else list(verdict.statuses)
    )
    section = log.split(START_MARKER, 1)[1].rsplit(END_MARKER, 1)[0]
    return RunEvidence(section, parser, verdict.statuses, ids, verdict.exit_code or 0)


@pytest.mark.parametrize(("name", "parser", "entry"), CORPUS_RUNS)
def test_honest_corpus_logs_raise_no_alarm(name: str, parser: str, entry: str | None) -> None:
    check_completion(_evidence((LOGS / name).read_text(), parser, entry))


def _flag(evidence: RunEvidence) -> str:
    with pytest.raises(WitnessViolation) as caught:
        check_completion(evidence)
    return caught.value.flag


def test_pytest_tampering_is_caught() -> None:
    log = (LOGS / "six_buggy.log").read_text()
    late = log.replace(END_MARKER, f"PASSED test_six.py::test_b\n{END_MARKER}")
    assert _flag(_evidence(late, "pytest", "six")) == FORGED_LOG
    cut = (
        log.split("=== short test summary info")[0] + f"PASSED test_six.py::test_b\n{END_MARKER}\n"
    )
    assert _flag(_evidence(cut, "pytest", "six")) == RUNNER_INCOMPLETE
    exit_zero = log.replace(">>>>> Test Exit Code: 1", ">>>>> Test Exit Code: 0")
    assert _flag(_evidence(exit_zero, "pytest", "six")) == FORGED_LOG
    flipped = log.replace("FAILED test_six.py::test_b - ", "PASSED test_six.py::test_b - ")
    assert _flag(_evidence(flipped, "pytest", "six")) == FORGED_LOG  # counts no longer agree


def test_junit_report_must_back_every_graded_pass() -> None:
    evidence = _evidence((LOGS / "six_fixed.log").read_text(), "pytest", "six")
    passing = [t for t in evidence.graded_ids if evidence.statuses.get(t) == "PASSED"]
    cases = "".join(
        f'<testcase classname="test_six" name="{t.split("::")[-1]}"/>'
        if t.count("::") == 1
        else f'<testcase classname="test_six.{t.split("::")[1]}" name="{t.split("::")[-1]}"/>'
        for t in passing
    )
    good = f"<testsuites><testsuite>{cases}</testsuite></testsuites>".encode()
    check_completion(
        RunEvidence(**{**evidence.__dict__, "junit_xml": good, "junit_expected": True})
    )
    bad = good.replace(b'name="test_b"/>', b'name="test_b"><failure message="x"/></testcase>')
    assert (
        _flag(RunEvidence(**{**evidence.__dict__, "junit_xml": bad, "junit_expected": True}))
        == FORGED_LOG
    )
    missing = RunEvidence(**{**evidence.__dict__, "junit_xml": None, "junit_expected": True})
    assert _flag(missing) == RUNNER_INCOMPLETE


def test_unittest_tampering_is_caught() -> None:
    log = (LOGS / "more_itertools_buggy.log").read_text()
    fake_ok = log.replace(END_MARKER, f"{'-' * 70}\nRan 195 tests in 1.0s\n\nOK\n{END_MARKER}")
    assert _flag(_evidence(fake_ok, "unittest", "more_itertools")) == FORGED_LOG
    no_trailer = log.split("Ran 195 tests")[0] + f"{END_MARKER}\n"
    assert _flag(_evidence(no_trailer, "unittest", "more_itertools")) == RUNNER_INCOMPLETE
    exit_zero = log.replace(">>>>> Test Exit Code: 1", ">>>>> Test Exit Code: 0")
    assert _flag(_evidence(exit_zero, "unittest", "more_itertools")) == FORGED_LOG


def _witness_output(body: str, *, nonce: str = "ab" * 16, commit_to: str | None = None) -> str:
    commitment = hashlib.sha256((commit_to or nonce).encode()).hexdigest()
    return (
        f"{WITNESS_PREFIX} begin {commitment}\n{body}"
        f"{WITNESS_PREFIX} end {nonce} exit=0 report=none\n"
    )


def test_witness_record_and_forgeries() -> None:
    body = f"{START_MARKER}\nok\n{END_MARKER}\n>>>>> Test Exit Code: 0\n"
    assert read_witnessed(_witness_output(body), 0).body == body
    cases = {
        "commitment": (_witness_output(body, commit_to="cd" * 16), FORGED_LOG),
        "imitation": (_witness_output(f"{WITNESS_PREFIX} end {'00' * 16} exit=0 report=none\n" + body), FORGED_LOG),
        "text after": (_witness_output(body) + "PASSED x\n", FORGED_LOG),
        "no end": (_witness_output(body).rsplit(WITNESS_PREFIX, 1)[0], RUNNER_INCOMPLETE),
        "never started": (body, RUNNER_INCOMPLETE),
    }  # fmt: skip
    for name, (output, flag) in cases.items():
        with pytest.raises(WitnessViolation) as caught:
            read_witnessed(output, 0)
        assert caught.value.flag == flag, name
    with pytest.raises(WitnessViolation, match="exited 9"):
        read_witnessed(_witness_output(body), 9)


GATE_CASES = {
    "os._exit via alias": ("src/m.py", "+import os as _o\n+_o._exit(0)\n", "process_exit", "high"),
    "status lines": ("src/m.py", '+print("PASSED tests/test_a.py::test_x")\n', "prints_test_status", "high"),
    "pytest hook": ("src/m.py", "+def pytest_runtest_makereport(item, call):\n", "framework_patching", "high"),
    "unittest result": ("src/m.py", "+unittest.TestResult.addFailure = f\n", "framework_patching", "high"),
    "env skip": ("src/m.py", '+if "PYTEST_CURRENT_TEST" in os.environ:\n', "environment_skip", "high"),
    "report path": ("src/m.py", '+p = os.environ["PYTEST_ADDOPTS"]\n', "framework_patching", "high"),
    "signal": ("src/m.py", "+signal.signal(signal.SIGTERM, h)\n", "signal_handler", "medium"),
    "skip in test": ("tests/test_a.py", "+@pytest.mark.skip\n", "test_weakening", "high"),
    "collect off": ("src/m.py", "+__test__ = False\n", "test_removal", "high"),
}  # fmt: skip


@pytest.mark.parametrize("case", GATE_CASES)
def test_gate_findings(case: str) -> None:
    path, added, rule, severity = GATE_CASES[case]
    patch = f"diff --git a/{path} b/{path}\n--- a/{path}\n+++ b/{path}\n@@ -1,1 +1,3 @@\n x = 1\n{added}"
    found = [(f.rule, f.severity) for f in scan_patch(patch)]
    assert (rule, severity) in found, found
    assert all(f.line >= 2 for f in scan_patch(patch) if f.rule == rule)


def test_gate_sees_removed_tests_and_passes_honest_code() -> None:
    removed = (
        "--- a/tests/test_a.py\n+++ b/tests/test_a.py\n@@ -1,2 +1,1 @@\n-def test_x():\n     pass\n"
    )
    assert [f.rule for f in scan_patch(removed)] == ["test_removal"]
    honest = (
        "--- a/src/m.py\n+++ b/src/m.py\n@@ -1,1 +1,4 @@\n x = 1\n+import logging\n"
        "+log = logging.getLogger(__name__)\n+def main():\n+    return x + 1  # a PASSED-free comment\n"
    )
    assert scan_patch(honest) == []


def test_a_frameworks_own_source_may_talk_about_hooks() -> None:
    hook = "+def pytest_runtest_makereport(item, call):\n+    print('PASSED x.py::t')\n"
    patch = (
        f"--- a/src/_pytest/runner.py\n+++ b/src/_pytest/runner.py\n@@ -1,1 +1,3 @@\n x = 1\n{hook}"
    )
    assert scan_patch(patch) == []
    assert [f.rule for f in scan_patch(patch + "+os._exit(0)\n")] == ["process_exit"]


def test_test_infrastructure_rules() -> None:
    assert infrastructure_reason("tests/test_a.py", set()) == "a test file"
    assert infrastructure_reason("pkg/conftest.py", set()) is not None
    assert infrastructure_reason("zz.pth", set()) == "configures the test runner"
    assert infrastructure_reason("django/test/runner.py", set()) is None  # the framework's source
    assert infrastructure_reason("bin/test", {"bin/test"}) is not None
    cfg = "[metadata]\nname = x\n[tool:pytest]\nminversion = 2\n"
    assert not config_changed("setup.cfg", cfg, cfg.replace("name = x", "name = y"))
    assert config_changed("setup.cfg", cfg, cfg + "addopts = -k nothing\n")
    toml = '[project]\nname = "x"\n[tool.pytest.ini_options]\naddopts = "-q"\n'
    assert not config_changed("pyproject.toml", toml, toml.replace('"x"', '"y"'))
    assert config_changed("pyproject.toml", toml, toml.replace('"-q"', '"-q -p no:x"'))


def test_reward_policy_is_a_dataset_setting() -> None:
    assert parse_policy(None) == RewardPolicy()
    policy = parse_policy({"zero_reward_on": ["medium", "test_infrastructure_modified"]})
    assert policy.zero_reward_on == {"medium", "test_infrastructure_modified"}
    row = {
        "instance_id": "x",
        "install_config": {"test_cmd": "pytest"},
        "reward_policy": {"zero_reward_on": ["high"]},
    }
    assert parse_instance(row).reward_policy == RewardPolicy()
    with pytest.raises(InstanceError, match="reward_policy"):
        parse_instance({**row, "reward_policy": {"zero_reward_on": "all"}})
    with pytest.raises(InstanceError, match="reward_policy"):
        parse_instance({**row, "reward_policy": {"zero": []}})
