"""The thin SDK on the oldest grpcio and protobuf that pyproject.toml admits.

The committed stubs check the runtime they are imported under (grpcio's
``GRPC_GENERATED_VERSION``, protobuf's gencode version), so a floor written in
pyproject.toml is only true if a venv holding exactly that floor imports them
and talks to a real stack. The venv (``grpcio==<floor>``, ``protobuf==<floor>``,
then this tree's wheel with ``--no-deps``) also holds nothing else, so it is
where "the SDK alone" is checked: no server package, the CLI's client commands
work and ``orchard up`` names the extras it needs.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.stack import Stack

from .conftest import check_smoke, run_smoke
from .venvs import PYPROJECT, SERVER_MODULES, Venv, cached_venv, floor_requirements

# A first run makes the venvs (pip downloads grpcio and protobuf); later runs reuse them.
pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def floor_venv(orchard_wheel: Path) -> Venv:
    return cached_venv("floor", Path(sys.executable), floor_requirements(), orchard_wheel)


def test_the_floor_venv_holds_the_floor_and_nothing_of_the_servers(floor_venv: Venv) -> None:
    installed = floor_venv.distributions()
    for pin in floor_requirements():
        name, version = pin.split("==")
        assert installed[name].split(".")[: len(version.split("."))] == version.split("."), pin
    assert installed["orchard-env"]
    servers = {"structlog", "uvloop", "aiohttp", "numpy", "openai", "kubernetes"}
    assert not servers & set(installed), installed
    assert not [n for n in installed if n.startswith("opentelemetry")], installed
    # The floor satisfies the wheel's own requirements (pip says so, not us).
    check = subprocess.run(
        [str(floor_venv.python), "-m", "pip", "check"], capture_output=True, text=True
    )
    assert check.returncode == 0, check.stdout + check.stderr


def test_sdk_and_cli_import_on_the_floor(floor_venv: Venv, tmp_path: Path) -> None:
    probe = (
        "import sys, orchard, orchard.client, orchard.cli\n"
        "from orchard._proto.orchard.v1 import executor_pb2_grpc, sandbox_pb2_grpc\n"
        f"print(sorted(set({SERVER_MODULES!r}) & {{m.split('.')[0] for m in sys.modules}}))\n"
    )
    result = subprocess.run(
        [str(floor_venv.python), "-I", "-W", "error", "-c", probe],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout == "[]\n"


def test_orchard_up_names_the_extras_it_needs(floor_venv: Venv, tmp_path: Path) -> None:
    home = tmp_path / "home"
    result = subprocess.run(
        [str(floor_venv.orchard), "up", "--home", str(home), "--port", "0"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=60,
        stdin=subprocess.DEVNULL,
    )
    assert result.returncode == 1, (result.stdout, result.stderr)
    assert "pip install 'orchard-env[server,rewards]'" in result.stderr, result.stderr
    assert "structlog" in result.stderr and "Traceback" not in result.stderr
    assert not home.exists(), "orchard up touched its home before saying what is missing"


def test_version_in_the_thin_venv(floor_venv: Venv) -> None:
    result = subprocess.run(
        [str(floor_venv.orchard), "--version"], capture_output=True, text=True, timeout=60
    )
    version = PYPROJECT["project"]["version"]
    assert (result.returncode, result.stdout) == (0, f"orchard {version}\n")


@pytest.mark.runc
def test_exec_against_a_real_stack_on_the_floor(
    floor_venv: Venv, packaging_stack: Stack, tmp_path: Path
) -> None:
    report = run_smoke(floor_venv, packaging_stack, tmp_path)
    check_smoke(report, floor_venv)
    floor = dict(pin.split("==") for pin in floor_requirements())
    assert report["grpcio"].startswith(floor["grpcio"]), report
    assert report["protobuf"].startswith(floor["protobuf"]), report


@pytest.mark.runc
def test_cli_client_commands_on_the_floor(
    floor_venv: Venv, packaging_stack: Stack, tmp_path: Path
) -> None:
    def orchard(*args: str) -> subprocess.CompletedProcess[str]:
        result = subprocess.run(
            [str(floor_venv.orchard), *args],
            env=packaging_stack.env,
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=60,
            stdin=subprocess.DEVNULL,
        )
        assert result.returncode == 0 and "Traceback" not in result.stderr, (args, result)
        return result

    sandbox_id = orchard("create").stdout.strip()
    assert orchard("exec", sandbox_id, "--", "echo", "from the floor").stdout == "from the floor\n"
    (tmp_path / "up.txt").write_text("copied\n")
    orchard("cp", str(tmp_path / "up.txt"), f"{sandbox_id}:/work/up.txt")
    orchard("cp", f"{sandbox_id}:/work/up.txt", str(tmp_path / "down.txt"))
    assert (tmp_path / "down.txt").read_text() == "copied\n"
    assert sandbox_id in orchard("ls").stdout
    images = orchard("image", "ls").stdout.splitlines()
    assert images[0].split()[:2] == ["NAME", "DEFAULT"] and any(" yes " in i for i in images[1:])
    orchard("tenant", "ls")
    orchard("rm", sandbox_id)
