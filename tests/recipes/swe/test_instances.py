"""Instance rows -> rollout tasks: the bundled sample, the nested ``metadata`` shape, the
SWE-bench image name, and rows refused with the row and the field named."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from orchard.recipes.swe.instances import (
    InstanceError,
    instance_of,
    load_rows,
    load_tasks,
    tasks_of,
    to_task,
)


def test_the_bundled_sample_becomes_a_task_with_its_repository_in_testbed() -> None:
    (task,) = load_tasks()
    assert task.id == "orchard-samples__calc_divide-1"
    assert task.image == "debian:bookworm" and task.workdir == "/testbed"
    assert b"len(values) + 1" in task.files["/testbed/calc/__init__.py"]
    assert "/testbed/tests/test_calc.py" in task.files
    assert "git init" in task.setup[0] and "commit" in task.setup[0]
    assert "divides by one more" in task.prompt
    assert instance_of(task)["instance_id"] == task.id


def test_a_swebench_row_uses_its_image_and_its_own_repository() -> None:
    row = {"problem_statement": "boom", "metadata": json.dumps(
        {"instance_id": "astropy__astropy-12907", "repo": "astropy/astropy"})}  # fmt: skip
    task = to_task(row)
    assert task.image == "swebench/sweb.eval.x86_64.astropy_1776_astropy-12907"
    assert task.files == {} and task.setup == () and task.workdir == "/testbed"


@pytest.mark.parametrize(
    ("row", "message"),
    [
        ({"problem_statement": "x"}, "row (?): instance_id"),
        ({"instance_id": "a"}, "(a): problem_statement"),
        ({"instance_id": "a", "problem_statement": "x", "workdir": "rel"}, "workdir"),
        ({"instance_id": "a", "problem_statement": "x", "repo_files": {"../x": "y"}}, "'../x'"),
        ({"instance_id": "a", "problem_statement": "x", "repo_files": {"/etc/x": "y"}}, "/etc/x"),
        ({"instance_id": "a", "problem_statement": "x", "repo_files": {"f": 3}}, "must be text"),
        ({"instance_id": "a", "problem_statement": "x", "repo_files": "{"}, "not valid JSON"),
    ],
)
def test_bad_rows_name_the_field(row: dict[str, object], message: str) -> None:
    with pytest.raises(InstanceError) as err:
        to_task(row, "row" if "instance_id" in row else "row (?)")
    assert message in str(err.value)


def test_files_name_the_bad_line_and_refuse_duplicates(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    path.write_text('{"instance_id": "a", "problem_statement": "x"}\n\n[1]\n')
    with pytest.raises(InstanceError, match=r"t.jsonl:3: not a JSON object"):
        load_rows(path)
    path.write_text("")
    with pytest.raises(InstanceError, match="no rows"):
        load_rows(path)
    row = {"instance_id": "a", "problem_statement": "x"}
    with pytest.raises(InstanceError, match="appears twice"):
        tasks_of([row, row])
