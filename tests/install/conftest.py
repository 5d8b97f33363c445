"""One stack and one wheel for every packaging test of a run (venvs are cached apart).

The wheel is built in the checkout's build/ and the venvs are cached under build/test-venvs,
so two processes must not run these at once: under ``make test``'s parallel phase the
whole folder is one group (one worker, one stack, one wheel; ``GROUPS`` in tests/phases.py).
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.stack import REQUIRES_STACK, Stack, running_stack

from .venvs import SERVER_MODULES, Venv, build_wheel

SMOKE = Path(__file__).with_name("smoke_client.py")


@pytest.fixture(scope="session")
def orchard_wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_wheel(tmp_path_factory.mktemp("wheel"))


@pytest.fixture(scope="session")
def packaging_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """``orchard up`` from the dev venv (the services need every extra); the tests' venvs
    are its clients."""
    for mark in REQUIRES_STACK:
        if mark.name == "skipif" and mark.args[0]:
            pytest.skip(mark.kwargs["reason"])
    with running_stack(tmp_path_factory.mktemp("packaging") / "home") as stack:
        yield stack


def run_smoke(venv: Venv, stack: Stack, cwd: Path) -> dict[str, Any]:
    """smoke_client.py under ``venv``'s interpreter, isolated (-I: no PYTHONPATH, no cwd)."""
    result = subprocess.run(
        [str(venv.python), "-I", str(SMOKE)],
        env=stack.env,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
        stdin=subprocess.DEVNULL,
    )
    assert result.returncode == 0, f"smoke run under {venv.python}:\n{result.stderr}"
    report: dict[str, Any] = json.loads(result.stdout)
    return report


def check_smoke(report: dict[str, Any], venv: Venv) -> None:
    """What every smoke run must show, whatever the interpreter or the grpcio/protobuf."""
    assert report["orchard_file"].startswith(str(venv.path)), report["orchard_file"]
    assert (report["exit_code"], report["stdout"]) == (0, "42\n")
    assert report["written"] == 256 * 257 and report["read_back_matches"]
    assert report["async_stdout"] == "async\n"
    assert report["final_state"] == "deleted"
    assert not set(SERVER_MODULES) & set(report["modules"]), report["modules"]
