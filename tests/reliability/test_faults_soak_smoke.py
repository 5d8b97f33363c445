"""A ~20 s run of loadtest/soak.py: its cycles succeed, its samples are real, and a stack
that is torn down leaves nothing (the 20-minute run is ``make soak``, not part of make test)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.stack import REQUIRES_STACK

pytestmark = [*REQUIRES_STACK, pytest.mark.reliability]

SOAK = Path(__file__).resolve().parents[2] / "loadtest" / "soak.py"


def test_a_short_soak_cycles_and_leaves_nothing(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, str(SOAK), "--minutes", "0.25", "--concurrency", "4",
         "--sample-seconds", "2", "--max-cycles", "400", "--home", str(tmp_path / "home")],
        capture_output=True, text=True, timeout=180,
    )  # fmt: skip
    report = json.loads(result.stdout)
    print(json.dumps({k: v for k, v in report.items() if k != "bounds"}))
    assert report["failures"] == 0, report["errors"]
    assert report["cycles"] >= 20
    assert report["samples"] >= 5
    resources = report["resources"]
    # Sandboxes really existed while it ran, and none are left at the end.
    assert resources["mounts"]["max"] > 0 and resources["mounts"]["end"] == 0
    assert resources["orchard_cgroups"]["max"] > 0 and resources["orchard_cgroups"]["end"] == 0
    assert resources["live_rows"]["end"] == 0
    assert resources["init_processes"]["end"] == 0
    assert resources["store_rows"]["end"] == report["cycles"]
    # Slopes over a few seconds are noise, so only the end-state bounds are checked here.
    assert not [v for v in report["violations"] if "at the end" in v], report["violations"]
