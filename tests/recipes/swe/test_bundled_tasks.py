"""The bundled task set's manifest and its build (no sandboxes: the grader check is
test_bundled_tasks_live.py). The build runs from the sdists ``make swe-tasks`` cached."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
from orchard.recipes.swe.bundled import (
    BuildError,
    build,
    bundled_tasks,
    data_dir,
    fetch_sdist,
    instances_path,
    split_statuses,
)
from orchard.recipes.swe.tasks import load_tasks, patch_files


def test_at_least_ten_real_bugs_from_distinct_packages() -> None:
    tasks = bundled_tasks()
    assert len(tasks) >= 10
    assert len({t.package for t in tasks}) == len(tasks)
    assert len({t.instance_id for t in tasks}) == len(tasks)
    for t in tasks:
        assert re.fullmatch(r"[0-9a-f]{64}", t.sha256), t.name
        assert re.fullmatch(r"[0-9a-f]{40}", t.fix_commit), t.name
        assert t.fix == f"https://github.com/{t.repo}/commit/{t.fix_commit}"
        assert t.sdist.endswith(f"-{t.version}.tar.gz") and t.bug and t.issue


def test_gold_is_source_only_and_test_patch_tests_only() -> None:
    for t in bundled_tasks():
        gold = patch_files((t.folder / "gold.patch").read_text())
        tests = patch_files((t.folder / "test.patch").read_text())
        assert gold and not any("test" in p.split("/")[-1] or "/tests/" in f"/{p}" for p in gold), (
            t.name
        )
        assert tests and all("test" in p for p in tests), t.name
        assert t.fail_to_pass and not set(t.fail_to_pass) & set(t.pass_to_pass), t.name
        for test_id in t.fail_to_pass + t.pass_to_pass:
            assert any(test_id.startswith(f"{arg}::") for arg in t.tests), (t.name, test_id)
        problem = (t.folder / "problem.md").read_text()
        assert len(problem) > 100 and "diff --git" not in problem, t.name


def test_build_from_the_cached_sdists_matches_the_built_file(tmp_path: Path) -> None:
    cache = data_dir() / "sdists"
    missing = [t.sdist for t in bundled_tasks() if not (cache / t.sdist).exists()]
    if missing:
        pytest.fail(f"{cache} lacks {missing}: `make swe-tasks` downloads them")
    (tmp_path / "sdists").mkdir()
    for t in bundled_tasks():
        shutil.copy(cache / t.sdist, tmp_path / "sdists" / t.sdist)
    built = build(tmp_path)
    assert built.read_text() == instances_path().read_text()  # deterministic, and not stale
    tasks = load_tasks(built, "orchard")
    for task, spec in zip(tasks, bundled_tasks(), strict=True):
        assert task.test_patch == (spec.folder / "test.patch").read_text()
        source = task.metadata["source"]
        assert (source["sha256"], source["fix"]) == (spec.sha256, spec.fix)
        # the buggy tree lacks the fix: the gold patch's added lines are not in it yet
        added = [
            line[1:]
            for line in task.gold_patch.splitlines()
            if line.startswith("+") and not line.startswith("+++") and line[1:].strip()
        ]
        files = patch_files(task.gold_patch)
        assert not all(line in task.repo_files[files[0]] for line in added), spec.name
        assert all(f in task.repo_files for f in files)
        row = json.loads(built.read_text().splitlines()[tasks.index(task)])
        assert row["install_config"]["log_parser"] == "parse_log_pytest"


def test_a_tampered_sdist_is_refused(tmp_path: Path) -> None:
    task = bundled_tasks()[0]
    (tmp_path / task.sdist).write_bytes(b"not the release")
    with pytest.raises(BuildError, match=f"{task.name}: .* has sha256 .*, pinned {task.sha256}"):
        fetch_sdist(task, tmp_path)


def test_split_statuses_leaves_out_ids_cut_at_a_space() -> None:
    before = {"t.py::a": "FAILED", "t.py::b": "PASSED", "t.py::c[x": "FAILED", "t.py::d": "PASSED"}
    after = {"t.py::a": "PASSED", "t.py::b": "PASSED", "t.py::c[x": "PASSED", "t.py::d": "FAILED"}
    assert split_statuses(before, {**after, "t.py::e": "XFAIL"}) == (
        ["t.py::a", "t.py::e"],
        ["t.py::b"],
    )
