"""The thin SDK on every CPython >= 3.11 this machine has, against one real stack.

Each interpreter gets its own cached venv with ``pip install <this tree's wheel>``
(pip resolves grpcio and protobuf for that Python, as a user's install would),
then runs the smoke path (create, exec, write/read, delete). Whatever set of
interpreters exists is tested and named in the test ids; one that is found but
cannot make a venv, install the SDK or run it is a failure, never a skip.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from tests.stack import Stack

from .conftest import check_smoke, run_smoke
from .interpreters import Interpreter, find_cpythons
from .venvs import cached_venv

# A first run makes the venvs (pip downloads grpcio and protobuf); later runs reuse them.
pytestmark = pytest.mark.timeout(300)

INTERPRETERS = find_cpythons()


def test_the_running_interpreter_is_found() -> None:
    real = Path(getattr(sys, "_base_executable", sys.executable)).resolve()
    assert real in {i.path for i in INTERPRETERS}, INTERPRETERS


@pytest.mark.runc
@pytest.mark.parametrize("interpreter", INTERPRETERS, ids=str)
def test_thin_sdk_smoke_run(
    interpreter: Interpreter, orchard_wheel: Path, packaging_stack: Stack, tmp_path: Path
) -> None:
    name = "py" + ".".join(map(str, interpreter.version))
    venv = cached_venv(name, interpreter.path, [], orchard_wheel)
    installed = venv.distributions()
    servers = {"structlog", "uvloop", "aiohttp", "numpy", "openai", "kubernetes"}
    assert not servers & set(installed), installed
    report = run_smoke(venv, packaging_stack, tmp_path)
    check_smoke(report, venv)
    assert report["python"] == ".".join(map(str, interpreter.version))
    print(json.dumps({k: report[k] for k in ("python", "executable", "grpcio", "protobuf")}))
