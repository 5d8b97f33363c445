"""docs/reference/cli.md is what scripts/gen_cli_reference.py makes from the parsers today."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_committed_cli_reference_is_fresh() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ORCHARD_")}
    result = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "gen_cli_reference.py"), "--check"],
        capture_output=True,
        text=True,
        env={**env, "COLUMNS": "40"},  # the page must not follow the terminal's width
        timeout=60,
    )
    assert result.returncode == 0, result.stderr


def test_the_reference_names_every_command() -> None:
    text = (ROOT / "docs" / "reference" / "cli.md").read_text()
    for command in ("orchard info", "orchard rm", "orchard image ls", "orchard pool ls"):
        assert f"`{command}`" in text, command
    assert "128+N" in text and "--json" in text
