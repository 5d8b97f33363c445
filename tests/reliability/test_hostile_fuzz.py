"""A few seconds of each atheris target (tests/reliability/fuzz/targets.py).

``make fuzz`` runs them for 30 s / 50k inputs each; here each gets a short
run so a parser change that crashes on hostile bytes is caught by the suite.
A finding makes the target exit non-zero and write ``crash-*`` (shown).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from .fuzz.targets import TARGETS

pytestmark = [pytest.mark.reliability, pytest.mark.timeout(120)]

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("target", sorted(TARGETS))
def test_fuzz_target_briefly(target: str, tmp_path: Path) -> None:
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "tests.reliability.fuzz.targets",
            target,
            "-runs=5000",
            "-max_total_time=4",
        ],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=110,
    )
    crashes = [p.name for p in tmp_path.glob("crash-*")]
    assert done.returncode == 0 and not crashes, (crashes, done.stderr[-3000:])
    assert "Done " in done.stderr, done.stderr[-1000:]
