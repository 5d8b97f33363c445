"""One version, written once (pyproject.toml), read from the installed metadata."""

from __future__ import annotations

import importlib.metadata
import subprocess
import sys

import orchard

from .venvs import PYPROJECT


def test_dunder_version_is_pyprojects() -> None:
    assert orchard.__version__ == PYPROJECT["project"]["version"]
    assert orchard.__version__ == importlib.metadata.version("orchard-env")


def test_orchard_dash_dash_version_prints_it_and_exits_zero() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "orchard.cli", "--version"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert (result.returncode, result.stdout, result.stderr) == (
        0,
        f"orchard {orchard.__version__}\n",
        "",
    )
