"""Instance rows in their several shapes, hostile rows, and patch extraction."""

from __future__ import annotations

import json

import pytest
from orchard.rewards.swe.eval_script import eval_script
from orchard.rewards.swe.grading import EvalType
from orchard.rewards.swe.instance import InstanceError, parse_instance
from orchard.rewards.swe.patch_extract import extract_patch
from orchard.rewards.swe.runner import grade_log
from orchard.rewards.swe.schemes import RewardScheme, reward_for

ROW = {
    "instance_id": "astropy__astropy-12907",
    "repo": "astropy/astropy",
    "FAIL_TO_PASS": '["a.py::t1", "a.py::t2"]',
    "PASS_TO_PASS": ["a.py::t3"],
    "install_config": {"test_cmd": "pytest -rA a.py"},
}

PATCH = "diff --git a/x.py b/x.py\n--- a/x.py\n+++ b/x.py\n@@ -1 +1 @@\n-a\n+b\n"


def test_swebench_row_with_json_strings_and_defaults() -> None:
    inst = parse_instance(ROW)
    assert inst.fail_to_pass == ["a.py::t1", "a.py::t2"]
    assert inst.pass_to_pass == ["a.py::t3"]
    assert inst.log_parser == "astropy"  # from the repository
    assert inst.image == "swebench/sweb.eval.x86_64.astropy_1776_astropy-12907:latest"
    assert inst.workdir == "/testbed"


def test_nested_metadata_shape_and_string_config() -> None:
    row = {
        "problem_statement": "fix it",
        "patch": PATCH,
        "metadata": {
            **ROW,
            "install_config": json.dumps(
                {"test_cmd": ["cd t", "pytest"], "log_parser": "parse_log_django"}
            ),
            "image_url": "reg/img:1",
            "workdir": "/repo",
            "pre_commands": ["export A=1"],
            "eval_type": "fail_only",
        },
    }
    inst = parse_instance(json.dumps(row))
    assert (inst.image, inst.workdir, inst.log_parser) == ("reg/img:1", "/repo", "django")
    assert inst.test_cmd == "cd t && pytest"
    assert inst.pre_commands == ["export A=1"]
    assert inst.eval_type is EvalType.FAIL_ONLY
    assert inst.gold_patch == PATCH and inst.problem_statement == "fix it"


@pytest.mark.parametrize(
    ("row", "field"),
    [
        ("not json", "instance"),
        ("[1, 2]", "instance"),
        ({**ROW, "instance_id": ""}, "instance_id"),
        ({**ROW, "FAIL_TO_PASS": "[oops"}, "FAIL_TO_PASS"),
        ({**ROW, "PASS_TO_PASS": [1, 2]}, "PASS_TO_PASS"),
        ({**ROW, "install_config": {}}, "test_cmd"),
        ({**ROW, "install_config": {"test_cmd": "x", "log_parser": "nope"}}, "log_parser"),
        ({**ROW, "eval_type": "both"}, "eval_type"),
        ({**ROW, "repo_files": {"../etc/passwd": "x"}}, "repo_files"),
        ({**ROW, "repo_files": {"/abs": "x"}}, "repo_files"),
    ],
)
def test_malformed_rows_name_the_field(row: object, field: str) -> None:
    with pytest.raises(InstanceError, match=field):
        parse_instance(row)  # type: ignore[arg-type]


def test_patch_extraction() -> None:
    assert extract_patch(PATCH) == PATCH
    assert extract_patch(f"I fixed it.\n```diff\n{PATCH}```\nDone.") == PATCH
    draft = PATCH.replace("+b", "+draft")
    assert extract_patch(f"```diff\n{draft}```\nbetter:\n```patch\n{PATCH}```") == PATCH
    assert extract_patch("Here:\n--- a/x.py\n+++ b/x.py\n@@ -1 +1 @@\n-a\n+b") == (
        "--- a/x.py\n+++ b/x.py\n@@ -1 +1 @@\n-a\n+b\n"
    )
    assert extract_patch("no diff, sorry") is None
    assert extract_patch("") is None
    assert extract_patch("```python\nprint('--- not a diff')\n```") is None


def test_eval_script_has_markers_and_exit_code() -> None:
    script = eval_script(parse_instance(ROW))
    assert script.index(">>>>> Start Test Output") < script.index("pytest -rA a.py")
    assert script.index("pytest -rA a.py") < script.index(">>>>> End Test Output")
    assert ">>>>> Test Exit Code: $ORCHARD_TEST_EXIT_CODE" in script


def test_reward_schemes() -> None:
    assert reward_for(RewardScheme.PM1, graded=True, resolved=False) == -1.0
    assert reward_for(RewardScheme.BINARY, graded=True, resolved=True) == 1.0
    assert reward_for(
        RewardScheme.PASS_RATE, graded=True, resolved=False, f2p_rate=0.5, p2p_rate=1.0
    ) == pytest.approx(0.85)
    assert (
        reward_for(RewardScheme.PASS_RATE, graded=False, resolved=False, f2p_rate=1, p2p_rate=1)
        == 0.0
    )


def test_grade_log_kinds() -> None:
    inst = parse_instance({**ROW, "install_config": {"test_cmd": "x", "log_parser": "pytest"}})
    ok = ">>>>> Start Test Output\nPASSED a.py::t1\nPASSED a.py::t2\nSKIPPED a.py::t3\n>>>>> End Test Output\n>>>>> Test Exit Code: 0\n"
    result = grade_log(inst, ok)
    assert (result.kind.value, result.resolved, result.reward) == ("graded", True, 1.0)
    skipped_f2p = ok.replace("PASSED a.py::t2", "SKIPPED a.py::t2")
    assert grade_log(inst, skipped_f2p).fail_to_pass.failure == ["a.py::t2"]
    timed_out = grade_log(inst, ">>>>> Start Test Output\n>>>>> Tests Timed Out\n")
    assert (timed_out.kind.value, timed_out.reward) == ("timeout", -1.0)
    liar = ok.replace("Exit Code: 0", "Exit Code: 3")
    assert (grade_log(inst, liar).kind.value, grade_log(inst, liar).reason) == (
        "invalid_log",
        "exit_code_mismatch",
    )
