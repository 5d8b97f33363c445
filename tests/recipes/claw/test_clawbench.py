"""claw-bench's tasks on the Claw format, without sandboxes: the installed wheel read whole,
malformed task folders named with their reason, the sandbox layout and commands, the score
script against real pytest JUnit reports, the conversion to Claw tasks, and the checked-in
triage (every task folder sorted, every refusal with a reason). The live half, in real
sandboxes through the Claw runner, is ``test_clawbench_live.py``."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from orchard.recipes.claw.clawbench import layout
from orchard.recipes.claw.clawbench.convert import claw_tasks, to_claw_task
from orchard.recipes.claw.clawbench.in_sandbox import junit_score
from orchard.recipes.claw.clawbench.source import BenchTask, Catalogue, load_catalogue, tasks_root
from orchard.recipes.claw.clawbench.triage import missing_piece
from orchard.recipes.claw.clawbench.triage_file import TRIAGE_PATH, load_triage
from orchard.recipes.claw.tasks import ClawTask, ScriptGrader, ScriptOracle, file_bytes

REASONS = {
    "malformed", "needs-package", "needs-command", "needs-network", "setup-fails",
    "reference-fails", "null-passes", "verifier-broken",
}  # fmt: skip


@pytest.fixture(scope="module")
def catalogue() -> Catalogue:
    return load_catalogue()


def test_the_installed_wheel_ships_222_readable_tasks_in_14_domains(catalogue: Catalogue) -> None:
    assert catalogue.version == "0.1.0"
    assert catalogue.malformed == []
    assert len(catalogue.tasks) == 222
    assert len({t.id for t in catalogue.tasks}) == 222
    domains = {t.domain for t in catalogue.tasks}
    assert len(domains) == 14 and {"email", "calendar", "security", "memory"} <= domains
    for t in catalogue.tasks:
        assert t.rel.split("/")[0] == t.domain
        assert "verifier/test_output.py" in t.verifier and t.solution.strip()
        assert "environment/setup.sh" in t.environment
        # pip's byte-compiled copies of the data .py files are not task content
        assert not any("__pycache__" in p or p.endswith(".pyc") for p in t.environment)


def _copy_task(root: Path, src: Path, domain: str, name: str) -> Path:
    dest = root / domain / name
    shutil.copytree(src, dest, ignore=shutil.ignore_patterns("__pycache__"))
    return dest


def test_malformed_task_folders_are_named_with_their_reason(tmp_path: Path) -> None:
    real = tasks_root()
    email = sorted((real / "email").iterdir())
    root = tmp_path / "tasks"
    root.mkdir()
    shutil.copy(real / "conftest.py", root / "conftest.py")
    good = _copy_task(root, email[0], "email", email[0].name)
    twin = _copy_task(root, email[0], "email", "zz-twin")  # same id as `good`
    bad_toml = _copy_task(root, email[1], "email", "bad-toml")
    (bad_toml / "task.toml").write_text('id = "x"\nlevel = "L9"\n')
    no_verifier = _copy_task(root, email[2], "email", "no-verifier")
    shutil.rmtree(no_verifier / "verifier")
    linked = _copy_task(root, email[3], "email", "linked")
    (linked / "environment" / "data" / "passwd").symlink_to("/etc/passwd")
    (root / "_schema").mkdir()  # not a domain
    found = load_catalogue(root)
    assert [t.rel for t in found.tasks] == [f"email/{good.name}"]
    reasons = {m.rel: m.reason for m in found.malformed}
    assert set(reasons) == {f"email/{p.name}" for p in (twin, bad_toml, no_verifier, linked)}
    assert reasons["email/zz-twin"].startswith(f"id {found.tasks[0].id} repeats email/")
    assert reasons["email/bad-toml"].startswith("task.toml: ")
    assert reasons["email/no-verifier"] == "no verifier/test_output.py"
    assert reasons["email/linked"] == "environment/data/passwd is a symlink"


def test_the_prompt_is_claw_benchs_with_relative_workspace_paths_made_absolute() -> None:
    task = BenchTask(
        id="x-1", domain="email", level="L1", title="t", description="d", timeout=60,
        capabilities=(), tags=(), rel="email/x-1",
        instruction="Read `workspace/in.txt`, write workspace/out.json (not /workspace/x).",
        environment={}, solution="true\n", verifier={}, conftest=b"",
    )  # fmt: skip
    text = layout.prompt(task)
    assert text.startswith(
        "IMPORTANT: You must write all output files to the absolute path: /workspace/\n"
    )
    assert "Read `/workspace/in.txt`, write /workspace/out.json (not /workspace/x)." in text


def test_the_oracle_heredoc_writes_the_script_byte_for_byte(
    tmp_path: Path, catalogue: Catalogue
) -> None:
    for task in catalogue.tasks[::37]:
        target = tmp_path / f"{task.id}.sh"
        subprocess.run(["sh", "-c", layout._heredoc(str(target), task.solution)], check=True)
        expected = task.solution if task.solution.endswith("\n") else task.solution + "\n"
        assert target.read_text() == expected


def _junit(tmp_path: Path, body: str) -> dict[str, object]:
    test = tmp_path / "test_sample.py"
    test.write_text(body)
    junit = tmp_path / "junit.xml"
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--junitxml={junit}",
         str(test)],
        capture_output=True, text=True, cwd=tmp_path,
    )  # fmt: skip
    return junit_score.score(str(junit), done.returncode)


def test_the_score_script_reads_real_pytest_reports(tmp_path: Path) -> None:
    mixed = _junit(
        tmp_path,
        "import pytest\n"
        "def test_a(): pass\n"
        "def test_b(): pass\n"
        "def test_c(): assert False\n"
        "@pytest.fixture\ndef boom(): raise RuntimeError('fixture')\n"
        "def test_d(boom): pass\n"
        "def test_e(): pytest.skip('no')\n",
    )
    assert (mixed["passed"], mixed["failed"], mixed["errors"], mixed["skipped"]) == (2, 1, 1, 1)
    assert mixed["score"] == 0.5 and mixed["all_passed"] is False and mixed["exit_code"] == 1
    assert mixed["components"] == {
        "test_sample::test_a": 1.0, "test_sample::test_b": 1.0,
        "test_sample::test_c": 0.0, "test_sample::test_d": 0.0,
    }  # fmt: skip
    clean = _junit(tmp_path, "def test_a(): pass\n")
    assert (clean["score"], clean["all_passed"], clean["problem"]) == (1.0, True, None)
    broken = _junit(tmp_path, "import no_such_module_here\ndef test_a(): pass\n")
    assert broken["score"] == 0.0 and broken["errors"] == 1 and not broken["all_passed"]
    assert list(broken["components"]) == [  # type: ignore[call-overload]
        "test_sample [does not import: ModuleNotFoundError: No module named 'no_such_module_here']"
    ]
    empty = _junit(tmp_path, "x = 1\n")
    assert empty["score"] == 0.0 and empty["problem"] == "the verifier ran no check"
    missing = junit_score.score(str(tmp_path / "none.xml"), 137)
    assert missing["score"] == 0.0 and str(missing["problem"]).startswith("no JUnit report")


def test_every_task_converts_to_a_claw_task_that_hides_its_solution_and_verifier(
    catalogue: Catalogue,
) -> None:
    for bench in catalogue.tasks:
        task = to_claw_task(bench, catalogue.version)
        assert ClawTask.from_json(json.loads(json.dumps(task.to_json()))) == task
        assert task.fixtures is None and task.category == bench.domain
        assert task.environment.image is None and task.environment.workdir == "/workspace"
        here = layout.task_dir(bench)
        assert all(p.startswith(f"{here}/environment/") for p in task.environment.files)
        assert isinstance(task.grader, ScriptGrader) and isinstance(task.oracle, ScriptOracle)
        assert f"{here}/verifier/test_output.py" in task.grader.files
        assert file_bytes(task.grader.files[f"{layout.TASKS_DIR}/conftest.py"]) == bench.conftest
        # the agent's sandbox gets neither the reference solution nor the verifier's checks
        shipped = b"".join(file_bytes(c) for c in task.environment.files.values())
        assert bench.solution.encode() not in shipped or not bench.solution.strip()
        assert task.metadata["claw_bench"]["folder"] == bench.rel


def test_the_checked_in_triage_sorts_every_task_folder_with_a_reason(catalogue: Catalogue) -> None:
    data = load_triage()
    assert data["claw_bench"] == catalogue.version and data["network"] == "none"
    entries = data["tasks"]
    assert data["task_folders"] == catalogue.total == len(entries)
    assert {e["rel"] for e in entries} == {t.rel for t in catalogue.tasks}
    counts: dict[str, int] = {}
    for e in entries:
        counts[e["status"]] = counts.get(e["status"], 0) + 1
        assert e["status"] in ("accepted", "refused"), e
        if e["status"] == "refused":
            assert e["reason"] in REASONS and len(e["detail"]) > 20, e
        else:
            assert e["reason"] == "" and e["null_score"] < 0.75 and e["checks"] >= 1, e
    assert counts == data["counts"]
    accepted = claw_tasks(catalogue)
    assert [t.id for t in accepted] == [e["id"] for e in entries if e["status"] == "accepted"]
    assert len(accepted) >= 200


@pytest.mark.parametrize(
    ("text", "reason", "what"),
    [
        ("Traceback ...\nModuleNotFoundError: No module named 'yaml'\n", "needs-package", "'yaml'"),
        ("ModuleNotFoundError: No module named 'google.protobuf'", "needs-package", "'google'"),
        ("/opt/x/solve.sh: line 8: python: command not found\n", "needs-command", "'python'"),
        ("sh: 1: jq: not found\n", "needs-command", "'jq'"),
        ("curl: (6) Could not resolve host: example.com\n", "needs-network", "resolve"),
    ],
)
def test_missing_pieces_are_read_from_real_error_messages(
    text: str, reason: str, what: str
) -> None:
    found = missing_piece(text)
    assert found is not None and found[0] == reason and what in found[1]


def test_an_ordinary_failure_is_no_missing_piece() -> None:
    assert missing_piece("AssertionError: expected 3 rows, got 2") is None


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "orchard.recipes.claw.clawbench", *args],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip


def test_the_cli_lists_triages_and_exports(tmp_path: Path) -> None:
    listed = _cli("list")
    assert listed.returncode == 0 and "222 task folders" in listed.stdout
    triage = _cli("triage")
    assert triage.returncode == 0, triage.stderr
    refused = [e for e in load_triage()["tasks"] if e["status"] == "refused"]
    for e in refused:
        assert e["id"] in triage.stdout and e["reason"] in triage.stdout
    out = tmp_path / "tasks.jsonl"
    exported = _cli("export", "--out", str(out), "--only", "eml-001,cal-001")
    assert exported.returncode == 0, exported.stderr
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert [t["id"] for t in lines] == ["cal-001", "eml-001"]
    unknown = _cli("export", "--out", str(out), "--only", "no-such")
    assert unknown.returncode != 0 and "no-such" in unknown.stderr
    assert TRIAGE_PATH.exists()
