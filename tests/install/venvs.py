"""Fresh venvs holding only the thin SDK, cached under build/test-venvs.

What a user gets from ``pip install orchard-env`` is tested where it lives: a
venv of its own with the wheel built from this tree, not the dev venv (which
holds every extra). Making a venv and installing grpcio costs seconds, so a
venv is kept between runs and made anew only when what it was made for (its
interpreter, its requirement lines) changes; the orchard wheel itself is
reinstalled every run (``--no-deps --force-reinstall``), so the code under test
is always this tree's.
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import subprocess
import sys
import tomllib
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CACHE = ROOT / "build" / "test-venvs"
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())

# What the SDK must never pull in, at import or on its everyday calls: the
# services' packages (the [server], [kubernetes] and [rewards] extras). Not
# grpc_health: where grpcio-health-checking is installed, `import grpc` itself
# imports it (grpc/__init__.py aliases grpc.health), so its presence says nothing
# about the SDK; the import linter's contract checks our own code never imports it.
SERVER_MODULES = (
    "structlog",
    "uvloop",
    "opentelemetry",
    "aiohttp",
    "numpy",
    "openai",
    "kubernetes",
    "prometheus_client",
)

PIP_TIMEOUT = 600


def base_requirements() -> list[str]:
    """``[project] dependencies``: what ``pip install orchard-env`` installs."""
    deps: list[str] = PYPROJECT["project"]["dependencies"]
    return deps


def floor_requirements() -> list[str]:
    """Each base requirement pinned to its lower bound (``grpcio>=1.66,<2`` -> ``grpcio==1.66``)."""
    pins = []
    for line in base_requirements():
        match = re.fullmatch(r"([A-Za-z0-9._-]+)\s*>=\s*([0-9][0-9.]*)(?:\s*,.*)?", line.strip())
        assert match, f"pyproject dependency without a plain lower bound: {line!r}"
        pins.append(f"{match.group(1)}=={match.group(2)}")
    return pins


def pip(python: Path, *args: str) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(
        [str(python), "-m", "pip", "--disable-pip-version-check", *args],
        capture_output=True,
        text=True,
        timeout=PIP_TIMEOUT,
        stdin=subprocess.DEVNULL,
    )
    assert result.returncode == 0, f"pip {' '.join(args)} under {python}:\n{result.stderr}"
    return result


def build_wheel(out: Path) -> Path:
    """This tree as a wheel (what PyPI would serve), built with the dev venv's pip.

    setuptools builds in the tree's build/lib and packs whatever is there, so a
    module deleted from the sources would still ship (and still import) from a
    previous build's copy: those folders go first.
    """
    for stale in [ROOT / "build" / "lib", *(ROOT / "build").glob("bdist.*")]:
        shutil.rmtree(stale, ignore_errors=True)
    pip(Path(sys.executable), "wheel", "-q", "--no-deps", "-w", str(out), str(ROOT))
    (wheel,) = out.glob("orchard_env-*.whl")
    return wheel


@dataclass(frozen=True)
class Venv:
    path: Path

    @property
    def python(self) -> Path:
        return self.path / "bin" / "python"

    @property
    def orchard(self) -> Path:
        return self.path / "bin" / "orchard"

    def install_wheel(self, wheel: Path) -> None:
        pip(self.python, "install", "-q", "--no-deps", "--force-reinstall", str(wheel))

    def distributions(self) -> dict[str, str]:
        """{normalized name: version} of everything installed in it."""
        listed = json.loads(pip(self.python, "list", "--format=json").stdout)
        return {d["name"].lower().replace("_", "-"): d["version"] for d in listed}


def cached_venv(name: str, interpreter: Path, requirements: list[str], wheel: Path) -> Venv:
    """A venv of ``interpreter`` with ``requirements`` and then ``wheel`` (no deps) installed.

    ``requirements`` empty means "the wheel's own dependencies" (pip resolves them);
    a cached venv is reused while its interpreter and requirement lines are the same.
    """
    recipe = json.dumps(
        {
            "interpreter": str(interpreter),
            "requirements": requirements,
            "base": base_requirements(),
        },
        sort_keys=True,
    )
    key = hashlib.sha256(recipe.encode()).hexdigest()[:12]
    venv = Venv(CACHE / f"{name}-{key}")
    stamp = venv.path / "orchard-test-recipe.json"
    if not (stamp.is_file() and stamp.read_text() == recipe and venv.python.exists()):
        shutil.rmtree(venv.path, ignore_errors=True)
        venv.path.parent.mkdir(parents=True, exist_ok=True)
        made = subprocess.run(
            [str(interpreter), "-m", "venv", str(venv.path)],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert made.returncode == 0, f"{interpreter} -m venv: {made.stderr}"
        if requirements:
            pip(venv.python, "install", "-q", *requirements)
        else:
            pip(venv.python, "install", "-q", str(wheel))
        stamp.write_text(recipe)
    venv.install_wheel(wheel)
    return venv
