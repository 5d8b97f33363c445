"""Running another project's checks in its own venv against a stack of ours.

Harbor (Python >= 3.12) and NeMo Gym (>= 3.13) cannot install in the suite's 3.11
venv; ``make harbor-venv`` / ``make nemo-gym-venv`` (run by ``make test``) give each
its own venv with this package in it, and the tests here run a ``*_checks.py`` file
there with pytest (names not starting with ``test_``, so the 3.11 run never collects
them), pointed at the stack by ORCHARD_ENDPOINT / ORCHARD_API_KEY.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from tests.stack import Stack

ROOT = Path(__file__).resolve().parents[2]


def requires_venv(path: Path, make_target: str) -> pytest.MarkDecorator:
    return pytest.mark.skipif(
        not (path / ".installed").exists(), reason=f"needs {path.name} (make {make_target})"
    )


def stack_env(stack: Stack) -> dict[str, str]:
    key = (stack.home / "dev-api-key").read_text().strip()
    return {**stack.env, "ORCHARD_ENDPOINT": stack.endpoint, "ORCHARD_API_KEY": key}


def run_checks(path: Path, checks: Path, stack: Stack, timeout: float = 300) -> str:
    """pytest ``checks`` with ``path``'s interpreter; fails unless every check passed."""
    result = subprocess.run(
        [str(path / "bin" / "python"), "-m", "pytest", "-q", "-p", "no:cacheprovider", str(checks)],
        env={**stack_env(stack), "ORCHARD_TEST_STRICT": os.environ.get("ORCHARD_TEST_STRICT", "")},
        cwd=ROOT, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-3000:]
    summary = result.stdout.strip().splitlines()[-1]
    assert " passed" in summary and not any(
        word in summary for word in ("failed", "skipped", "error", "xfail")
    ), result.stdout
    return result.stdout
