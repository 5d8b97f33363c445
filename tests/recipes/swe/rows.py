"""Rows written by hand in each public dataset's own schema (field names, types and nesting
as the datasets' cards and loaders give them: see recipes/swe/tasks/_rows.py), for the
loader tests. Values are made up but shaped like the real ones."""

from __future__ import annotations

import json
from typing import Any

GOLD = (
    "diff --git a/pkg/core.py b/pkg/core.py\n--- a/pkg/core.py\n+++ b/pkg/core.py\n"
    "@@ -1 +1 @@\n-x = 1\n+x = 2\n"
)
TESTS = (
    "diff --git a/tests/test_core.py b/tests/test_core.py\n--- a/tests/test_core.py\n"
    "+++ b/tests/test_core.py\n@@ -1 +1,4 @@\n import pkg\n+\n+def test_x():\n"
    "+    assert pkg.core.x == 2\n"
    "diff --git a/tests/test more.py b/tests/test more.py\nnew file mode 100644\n"
    "--- /dev/null\n+++ b/tests/test more.py\n@@ -0,0 +1 @@\n+pass\n"
)
F2P = ["tests/test_core.py::test_x", "tests/test_core.py::test_y[a-b]"]
P2P = ["tests/test_core.py::test_old"]


def swe_bench(**over: Any) -> dict[str, Any]:
    return {
        "repo": "astropy/astropy",
        "instance_id": "astropy__astropy-12907",
        "base_commit": "d16bfe05a744909de4b27f5875fe0d4ed41ce607",
        "patch": GOLD,
        "test_patch": TESTS,
        "problem_statement": "Modeling's `separability_matrix` does not compute separability "
        "correctly for nested CompoundModels\n",
        "hints_text": "",
        "created_at": "2022-03-03T15:14:54Z",
        "version": "4.3",
        "FAIL_TO_PASS": json.dumps(F2P),
        "PASS_TO_PASS": json.dumps(P2P),
        "environment_setup_commit": "298ccb478e6bf092953bca67a3d29dc6c35f6752",
        **over,
    }


def swe_bench_verified(**over: Any) -> dict[str, Any]:
    return {**swe_bench(difficulty="15 min - 1 hour"), **over}


def swe_gym(**over: Any) -> dict[str, Any]:
    row = swe_bench(
        repo="getmoto/moto",
        instance_id="getmoto__moto-5752",
        version="4.0",
        FAIL_TO_PASS=F2P,
        PASS_TO_PASS=P2P,
    )
    del row["environment_setup_commit"]
    return {**row, **over}


def swe_rebench(**over: Any) -> dict[str, Any]:
    row = swe_bench(
        repo="pydata/xarray",
        instance_id="pydata__xarray-9760",
        version="2024.10",
        FAIL_TO_PASS=F2P,
        PASS_TO_PASS=P2P,
        meta={
            "commit_name": "head_commit",
            "failed_lite_validators": ["has_many_modified_files"],
            "has_test_patch": True,
            "is_lite": False,
            "llm_score": {"difficulty_score": 1, "issue_text_score": 0, "test_score": 1},
            "num_modified_files": 2,
        },
        install_config={
            "env_vars": None,
            "env_yml_path": ["ci/requirements/environment.yml"],
            "install": "python -m pip install -e .",
            "log_parser": "parse_log_pytest",
            "no_use_env": None,
            "packages": "environment.yml",
            "pip_packages": ["pytest", "pytest-xdist"],
            "pre_install": None,
            "python": "3.10",
            "reqs_path": None,
            "test_cmd": "pytest --continue-on-collection-errors -n0 -rA",
        },
        requirements="numpy==2.1.3\npandas==2.2.3\n",
        environment="name: testbed\nchannels:\n  - conda-forge\n",
        license_name="Apache License 2.0",
        docker_image="swerebench/sweb.eval.x86_64.pydata_1776_xarray-9760",
    )
    return {**row, **over}


def swe_rebench_v2(**over: Any) -> dict[str, Any]:
    return {
        "base_commit": "ad6bff35c39a0600fb8f2e176be4269e768e4e22",
        "created_at": 1609298073000,
        "instance_id": "pallets__click-2800",
        "meta": {
            "llm_metadata": [{"code": "A", "confidence": 0.97, "difficulty": "medium"}],
            "num_modified_files": 1,
            "num_modified_lines": 6,
            "pr_author": "someone",
            "pr_labels": [],
            "pr_url": None,
        },
        "patch": GOLD,
        "pr_description": "Fix the flag's default.\n* fixes #2799\n",
        "problem_statement": "A boolean flag ignores its default when the envvar is empty.\n",
        "repo": "pallets/click",
        "test_patch": TESTS,
        "language": "python",
        "interface": "",
        "PASS_TO_PASS": P2P,
        "FAIL_TO_PASS": F2P,
        "install_config": {
            "base_image_name": "python_base_310",
            "docker_specs": None,
            "install": ["pip install -e ."],
            "log_parser": "parse_log_pytest",
            "log_parsers": None,
            "test_cmd": ["pytest -rA tests/test_core.py"],
        },
        "image_name": "docker.io/swerebenchv2/pallets-click:2800-ad6bff3",
        **over,
    }


def scale_swe(**over: Any) -> dict[str, Any]:
    return {
        "instance_id": "pallets_click_pr2800",
        "user": "pallets",
        "repo": "click",
        "language": "python",
        "workdir": "/testbed",
        "image_url": "registry.example.org/scale-swe/pallets_click_pr2800:latest",
        "patch": GOLD,
        "pr_commit": "0123456789abcdef0123456789abcdef01234567",
        "parent_commit": "89abcdef0123456789abcdef0123456789abcdef",
        "problem_statement": "A boolean flag ignores its default when the envvar is empty.\n",
        "f2p_patch": TESTS,
        "f2p_script": "",
        "FAIL_TO_PASS": F2P,
        "PASS_TO_PASS": P2P,
        "github_url": "https://github.com/pallets/click",
        "pre_commands": ["git checkout 89abcdef0123456789abcdef0123456789abcdef"],
        **over,
    }


def write_jsonl(path: Any, rows: list[dict[str, Any]]) -> Any:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path
