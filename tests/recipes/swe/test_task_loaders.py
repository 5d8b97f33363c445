"""The task loaders on rows written in each public dataset's schema (tests/recipes/swe/rows.py),
from JSONL, JSON and Parquet (real pyarrow files): normalization, image names, the grader's
instance row (read back by the rewards service's own parser) and the rollout task, and
every kind of bad row refused with file, row and field named."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from orchard.recipes.swe.tasks import (
    FORMATS,
    SweTask,
    TaskNotGradable,
    TaskRowError,
    load_tasks,
    new_file_patch,
    swe_gym_image,
    swebench_image,
)
from orchard.rewards.swe.instance import parse_instance

from orchard.rollouts import Task
from tests.recipes.swe import rows
from tests.recipes.swe.rows import F2P, P2P, TESTS, write_jsonl

SAMPLES = Path(__file__).parents[3] / "recipes" / "swe" / "samples"


def _one(tmp_path: Path, format: str, row: dict[str, Any], **kw: Any) -> SweTask:
    [task] = load_tasks(write_jsonl(tmp_path / "rows.jsonl", [row]), format, **kw)
    return task


def test_swe_bench_and_verified_json_string_lists_and_official_image(tmp_path: Path) -> None:
    task = _one(tmp_path, "swe-bench", rows.swe_bench())
    assert task.image == "swebench/sweb.eval.x86_64.astropy_1776_astropy-12907:latest"
    assert (task.workdir, task.fail_to_pass, task.pass_to_pass) == (
        "/testbed",
        tuple(F2P),
        tuple(P2P),
    )
    assert task.metadata["environment_setup_commit"].startswith("298ccb")
    assert not task.gradable  # SWE-bench rows carry no test command
    with pytest.raises(TaskNotGradable, match=r"astropy__astropy-12907.*test_cmd="):
        task.grading_instance()
    verified = _one(tmp_path, "swe-bench-verified", rows.swe_bench_verified())
    assert verified.metadata["difficulty"] == "15 min - 1 hour"
    assert verified.dataset == "swe-bench-verified"


def test_test_cmd_template_gets_the_test_patch_files_quoted(tmp_path: Path) -> None:
    task = _one(tmp_path, "swe-bench", rows.swe_bench(), test_cmd="pytest -rA {test_files}")
    assert task.test_cmd == ("pytest -rA tests/test_core.py 'tests/test more.py'",)
    instance = parse_instance(task.grading_json())  # the rewards service's own reading
    assert instance.test_cmd == task.test_cmd[0]
    assert instance.log_parser == "astropy"  # chosen by the service from the repository
    assert instance.image == task.image and instance.fail_to_pass == F2P


def test_swe_gym_lists_and_its_image_set(tmp_path: Path) -> None:
    task = _one(tmp_path, "swe-gym", rows.swe_gym())
    assert task.image == "xingyaoww/sweb.eval.x86_64.getmoto_s_moto-5752:latest"
    assert task.fail_to_pass == tuple(F2P) and task.repo == "getmoto/moto"
    assert swe_gym_image("Project-MONAI__MONAI-6975") == (
        "xingyaoww/sweb.eval.x86_64.project-monai_s_monai-6975:latest"
    )
    assert (
        swebench_image("Django__django-1")
        == "swebench/sweb.eval.x86_64.django_1776_django-1:latest"
    )


def test_swe_rebench_v1_install_config_and_image_fallback(tmp_path: Path) -> None:
    task = _one(tmp_path, "swe-rebench", rows.swe_rebench())
    assert task.image == "swerebench/sweb.eval.x86_64.pydata_1776_xarray-9760"
    assert task.test_cmd == ("pytest --continue-on-collection-errors -n0 -rA",)
    assert task.log_parser == "parse_log_pytest" and task.workdir == "/testbed"
    assert task.metadata["license_name"] == "Apache License 2.0"
    assert task.metadata["meta"]["llm_score"]["test_score"] == 1
    row = rows.swe_rebench()
    del row["docker_image"]
    assert _one(tmp_path, "swe-rebench", row).image == (
        "swerebench/sweb.eval.x86_64.pydata_1776_xarray-9760:latest"
    )
    named = _one(tmp_path, "swe-rebench", {**row, "image_name": "swerebench/x:1"})
    assert named.image == "swerebench/x:1"
    assert parse_instance(task.grading_json()).test_cmd == task.test_cmd[0]


def test_swe_rebench_v2_epoch_dates_workdir_and_image(tmp_path: Path) -> None:
    task = _one(tmp_path, "swe-rebench-v2", rows.swe_rebench_v2())
    assert task.image == "docker.io/swerebenchv2/pallets-click:2800-ad6bff3"
    assert task.workdir == "/click"  # the repository's folder in its images
    assert task.metadata["created_at"] == "1609298073000"
    assert task.metadata["language"] == "python"
    instance = parse_instance(task.grading_json())
    assert (instance.workdir, instance.test_cmd) == ("/click", "pytest -rA tests/test_core.py")
    assert instance.log_parser == "pytest"


def test_scale_swe_test_command_and_f2p_script(tmp_path: Path) -> None:
    task = _one(tmp_path, "scale-swe", rows.scale_swe())
    assert task.repo == "pallets/click" and task.image.endswith("pallets_click_pr2800:latest")
    assert task.test_cmd == ("python -m pytest -rA tests/test_core.py",)
    assert task.test_patch == TESTS and task.pre_commands == (
        "git checkout 89abcdef0123456789abcdef0123456789abcdef",
    )
    script = "def test_repro():\n    assert 1 + 1 == 2"
    scripted = _one(
        tmp_path,
        "scale-swe",
        rows.scale_swe(
            f2p_patch="", f2p_script=script, FAIL_TO_PASS=["test_fail_to_pass.py::test_repro"]
        ),
    )
    assert scripted.test_patch == new_file_patch("test_fail_to_pass.py", script)
    assert "\\ No newline at end of file" in scripted.test_patch
    instance = parse_instance(scripted.grading_json())
    assert instance.pre_commands == list(scripted.pre_commands)
    assert instance.test_cmd == "python -m pytest -rA test_fail_to_pass.py tests/test_core.py"


def test_parquet_rows_read_like_jsonl(tmp_path: Path) -> None:
    """Parquet as the Hub stores these datasets: structs and lists as columns."""
    for format, make in (("swe-rebench-v2", rows.swe_rebench_v2), ("swe-bench", rows.swe_bench)):
        data = [make(), make(instance_id=make()["instance_id"] + "0")]
        parquet = tmp_path / f"{format}.parquet"
        pq.write_table(pa.Table.from_pylist(data), parquet)
        from_parquet = load_tasks(parquet, format)
        from_jsonl = load_tasks(write_jsonl(tmp_path / f"{format}.jsonl", data), format)
        assert from_parquet == from_jsonl and len(from_parquet) == 2


def test_json_array_file(tmp_path: Path) -> None:
    path = tmp_path / "sample.json"
    path.write_text(json.dumps([rows.swe_rebench_v2()]))  # SWE-rebench-V2's sample.json shape
    assert load_tasks(path, "swe-rebench-v2")[0].instance_id == "pallets__click-2800"


@pytest.mark.parametrize(
    ("format", "row", "field", "reason"),
    [
        ("swe-bench", rows.swe_bench(FAIL_TO_PASS="[not json"), "FAIL_TO_PASS", "not valid JSON"),
        ("swe-bench", rows.swe_bench(PASS_TO_PASS=[1, 2]), "PASS_TO_PASS.0", "string"),
        ("swe-bench", rows.swe_bench(repo="not a repo"), "repo", "pattern"),
        ("swe-bench", rows.swe_bench(test_patch=""), "test_patch", "at least 1"),
        ("swe-bench", rows.swe_bench(instance_id="../etc"), "instance_id", "must not contain"),
        (
            "swe-gym",
            {k: v for k, v in rows.swe_gym().items() if k != "base_commit"},
            "base_commit",
            "required",
        ),
        (
            "swe-rebench",
            rows.swe_rebench(install_config={"log_parser": "x"}),
            "install_config.test_cmd",
            "required",
        ),
        (
            "swe-rebench",
            rows.swe_rebench(install_config="{oops"),
            "install_config",
            "not valid JSON",
        ),
        (
            "swe-rebench",
            rows.swe_rebench(docker_image="Bad Image!"),
            "docker_image",
            "not an image reference",
        ),
        ("swe-rebench-v2", rows.swe_rebench_v2(image_name=""), "image_name", "at least 1"),
        (
            "swe-rebench-v2",
            rows.swe_rebench_v2(install_config={"test_cmd": ["pytest"]}),
            "install_config",
            "log_parser: required",
        ),
        (
            "scale-swe",
            rows.scale_swe(f2p_patch=None, f2p_script=None),
            "f2p_patch",
            "no tests to add",
        ),
        ("scale-swe", rows.scale_swe(workdir="relative"), "workdir", "pattern"),
        ("orchard", {**rows.swe_bench(), "image": "debian:bookworm"}, "install_config", "required"),
    ],
)
def test_bad_rows_name_file_row_and_field(
    tmp_path: Path, format: str, row: dict[str, Any], field: str, reason: str
) -> None:
    good = {
        "swe-bench": rows.swe_bench,
        "swe-gym": rows.swe_gym,
        "swe-rebench": rows.swe_rebench,
        "swe-rebench-v2": rows.swe_rebench_v2,
        "scale-swe": rows.scale_swe,
        "orchard": rows.swe_bench,
    }[format](instance_id="first-row")
    if format == "orchard":
        good = json.loads((SAMPLES / "instances.jsonl").read_text().splitlines()[0])
    path = write_jsonl(tmp_path / "data.jsonl", [good, row])
    with pytest.raises(TaskRowError) as caught:
        load_tasks(path, format)
    error = caught.value
    assert (error.path, error.row, error.field) == (path, 2, field), str(error)
    assert reason in error.reason and str(error).startswith(f"{path}: row 2: {field}: ")


def test_file_level_errors(tmp_path: Path) -> None:
    broken = tmp_path / "broken.jsonl"
    broken.write_text(json.dumps(rows.swe_bench()) + "\n\n{not json\n")
    with pytest.raises(TaskRowError, match=r"broken.jsonl: row 3: \(row\): not valid JSON"):
        load_tasks(broken, "swe-bench")
    twice = write_jsonl(tmp_path / "twice.jsonl", [rows.swe_bench(), rows.swe_bench()])
    with pytest.raises(
        TaskRowError, match=r"row 2: instance_id: 'astropy__astropy-12907' repeats row 1"
    ):
        load_tasks(twice, "swe-bench")
    scalar = write_jsonl(tmp_path / "scalar.jsonl", [rows.swe_bench()])
    scalar.write_text(scalar.read_text() + "[1]\n")
    with pytest.raises(TaskRowError, match=r"row 2: \(row\): must be an object, not list"):
        load_tasks(scalar, "swe-bench")
    not_parquet = tmp_path / "x.parquet"
    not_parquet.write_text("no")
    with pytest.raises(TaskRowError, match=r"row 0: \(file\): not a readable Parquet file"):
        load_tasks(not_parquet, "swe-bench")
    with pytest.raises(TaskRowError, match="unknown file type"):
        load_tasks(tmp_path / "x.csv", "swe-bench")
    with pytest.raises(ValueError, match="unknown dataset format 'swe-bunch'"):
        load_tasks(broken, "swe-bunch")
    assert set(FORMATS) == {
        "swe-bench", "swe-bench-verified", "swe-gym", "swe-rebench", "swe-rebench-v2", "scale-swe", "orchard",
    }  # fmt: skip


def test_sample_row_as_rollout_task_and_grading_instance() -> None:
    [task] = load_tasks(SAMPLES / "instances.jsonl", "orchard")
    rollout = task.rollout_task()
    assert isinstance(rollout, Task)
    assert rollout.image == "debian:bookworm" and rollout.workdir == "/testbed"
    assert rollout.files["/testbed/calc/__init__.py"].startswith(b'"""A tiny calculator')
    assert "git init" in rollout.setup[0] and "divides by one more" in rollout.prompt
    assert rollout.metadata["fail_to_pass"] == list(task.fail_to_pass)
    instance = parse_instance(task.grading_json())
    assert instance.repo_files == dict(task.repo_files)
    assert (instance.test_cmd, instance.log_parser) == (
        "python3 -m pytest -rA -p no:cacheprovider tests",
        "pytest",
    )
    assert instance.fail_to_pass == list(task.fail_to_pass)
