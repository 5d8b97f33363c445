"""make test's phases (tests/phases.py) and the durations that order its parallel phase
(scripts/durations.py): a real pytest run on a small suite of its own per phase."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.phases import load_durations, unit_of

ROOT = Path(__file__).resolve().parents[2]

CONFTEST = """
from tests import phases

def pytest_configure(config):
    phases.register(config)
"""


def _suite(tmp_path: Path) -> Path:
    (tmp_path / "conftest.py").write_text(CONFTEST)
    (tmp_path / "pytest.ini").write_text("[pytest]\nmarkers =\n    serial: alone\n")
    (tmp_path / "test_plain.py").write_text("def test_plain():\n    assert 1 + 1 == 2\n")
    (tmp_path / "test_alone.py").write_text(
        textwrap.dedent(
            """
            import pytest

            pytestmark = pytest.mark.serial

            def test_alone():
                assert 2 * 2 == 4
            """
        )
    )
    return tmp_path


def _pytest(suite: Path, phase: str | None, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "ORCHARD_TEST_PHASE"}
    if phase is not None:
        env["ORCHARD_TEST_PHASE"] = phase
    env["PYTHONPATH"] = str(ROOT)
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-rA", *args, str(suite)],
        cwd=suite,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_each_phase_runs_its_own_tests_and_deselects_the_others(tmp_path: Path) -> None:
    suite = _suite(tmp_path)
    serial = _pytest(suite, "serial")
    assert serial.returncode == 0, serial.stdout
    assert "PASSED test_alone.py::test_alone" in serial.stdout
    assert "1 passed, 1 deselected" in serial.stdout
    assert "orchard test phase: serial" in serial.stdout
    parallel = _pytest(suite, "parallel", "-n", "2", "--dist", "loadfile")
    assert parallel.returncode == 0, parallel.stdout
    assert "PASSED test_plain.py::test_plain" in parallel.stdout
    # xdist's summary leaves out what its workers deselected: one test ran, not the other.
    assert "test_alone" not in parallel.stdout and "= 1 passed in" in parallel.stdout
    everything = _pytest(suite, None)
    assert everything.returncode == 0 and "2 passed" in everything.stdout, everything.stdout


def test_a_phase_with_nothing_to_run_is_exit_code_5_and_a_bad_phase_is_refused(
    tmp_path: Path,
) -> None:
    suite = _suite(tmp_path)
    (suite / "test_alone.py").unlink()
    nothing = _pytest(suite, "serial")
    assert nothing.returncode == 5, nothing.stdout  # run_tests.sh fails if both phases say 5
    bad = _pytest(suite, "fast")
    assert bad.returncode == 4, bad.stdout + bad.stderr
    assert "ORCHARD_TEST_PHASE='fast': expected one of serial, parallel" in bad.stderr


def test_units_are_files_or_their_group() -> None:
    assert unit_of("tests/e2e/test_cli.py::test_readme_walkthrough") == "tests/e2e/test_cli.py"
    assert unit_of("tests/e2e/test_cli.py::TestX::test_y[a::b]") == "tests/e2e/test_cli.py"
    assert unit_of("tests/install/test_floor.py::test_version_in_the_thin_venv") == (
        "group:install"
    )
    assert unit_of("tests/installer/test_x.py::test_y") == "tests/installer/test_x.py"


def test_durations_file_is_read_or_refused(tmp_path: Path) -> None:
    path = tmp_path / "durations.json"
    assert load_durations(path) == {}
    path.write_text('{"tests/e2e/test_cli.py": 12.5, "group:install": 3}')
    assert load_durations(path) == {"tests/e2e/test_cli.py": 12.5, "group:install": 3.0}
    path.write_text('{"tests/e2e/test_cli.py": "slow"}')
    with pytest.raises(pytest.UsageError, match="expected"):
        load_durations(path)
    path.write_text("{")
    with pytest.raises(pytest.UsageError, match="not JSON"):
        load_durations(path)


def test_the_committed_durations_are_valid() -> None:
    durations = load_durations()
    assert all(seconds >= 0 for seconds in durations.values())


def test_junit_reports_sum_to_seconds_per_unit(tmp_path: Path) -> None:
    """scripts/durations.py as make's users run it (a package named ``scripts`` in the venv
    shadows the folder for imports)."""
    report = tmp_path / "parallel.xml"
    report.write_text(
        '<testsuites><testsuite name="pytest">'
        '<testcase classname="tests.e2e.test_cli" name="test_a" time="1.5"/>'
        '<testcase classname="tests.e2e.test_cli" name="test_b[x]" time="2.0"/>'
        '<testcase classname="tests.e2e.test_fake_parity.TestX" name="test_c" time="1.0"/>'
        '<testcase classname="tests.install.test_floor" name="test_c" time="4.0"/>'
        '<testcase classname="tests.install.test_extras" name="test_d" time="0.5"/>'
        "</testsuite></testsuites>"
    )
    script = [sys.executable, str(ROOT / "scripts" / "durations.py")]
    done = subprocess.run([*script, str(report)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {
        "group:install": 4.5,
        "tests/e2e/test_cli.py": 3.5,
        "tests/e2e/test_fake_parity.py": 1.0,
    }
    report.write_text(
        '<testsuites><testcase classname="tests.nowhere.test_x" name="t" time="1"/></testsuites>'
    )
    done = subprocess.run([*script, str(report)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 1 and "no test file for the JUnit class name" in done.stderr
