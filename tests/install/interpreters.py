"""Every CPython >= 3.11 on this machine, found the way a person would look for them.

Places: the running interpreter's base, ``python3.N`` on PATH and in /usr/bin and
/usr/local/bin, and pyenv's versions (``$PYENV_ROOT`` or ~/.pyenv; its shims are
skipped, they are scripts that pick one of those). Each candidate is asked what
it is (implementation, version, whether it is a venv); venvs and non-CPython
are left out, and one interpreter reached by two paths is kept once.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

MINIMUM = (3, 11)
_NAME = re.compile(r"python3\.\d+")
_PROBE = (
    "import json, platform, sys; print(json.dumps([platform.python_implementation(),"
    " list(sys.version_info[:3]), sys.prefix != sys.base_prefix]))"
)


@dataclass(frozen=True, order=True)
class Interpreter:
    version: tuple[int, int, int]
    path: Path

    def __str__(self) -> str:
        return f"cpython-{'.'.join(map(str, self.version))}-{self.path}"


def _candidates() -> list[Path]:
    found = [Path(getattr(sys, "_base_executable", sys.executable))]
    folders = [Path(p) for p in os.environ.get("PATH", "").split(os.pathsep) if p]
    folders += [Path("/usr/bin"), Path("/usr/local/bin")]
    pyenv = Path(os.environ.get("PYENV_ROOT") or Path.home() / ".pyenv")
    folders += sorted((pyenv / "versions").glob("*/bin"))
    for folder in folders:
        if folder.name == "shims" or not folder.is_dir():
            continue
        found += sorted(p for p in folder.iterdir() if _NAME.fullmatch(p.name))
    return found


def find_cpythons() -> list[Interpreter]:
    seen: dict[Path, Interpreter] = {}
    for candidate in _candidates():
        real = candidate.resolve()
        if real in seen or not os.access(real, os.X_OK):
            continue
        try:
            out = subprocess.run(
                [str(real), "-I", "-c", _PROBE], capture_output=True, text=True, timeout=20
            )
        except (OSError, subprocess.TimeoutExpired):
            continue
        if out.returncode != 0:
            continue
        implementation, version, in_venv = json.loads(out.stdout)
        if implementation == "CPython" and not in_venv and tuple(version[:2]) >= MINIMUM:
            seen[real] = Interpreter((version[0], version[1], version[2]), real)
    return sorted(seen.values())
