"""The shared libraries an ELF file needs, and the dynamic loader, as ``ldd`` resolves them.

``ldd`` (Debian's libc-bin) prints ``name => /path (addr)`` for each library
and ``/lib64/ld-linux-x86-64.so.2 (addr)`` for the loader; ``linux-vdso`` is
the kernel's and has no file. A library ``ldd`` cannot find is an error: a
bundle that misses one would fail only inside the sandbox.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

_RESOLVED = re.compile(r"^\s*(\S+)\s+=>\s+(\S+)\s+\(0x[0-9a-f]+\)\s*$")
_MISSING = re.compile(r"^\s*(\S+)\s+=>\s+not found\s*$")
_LOADER = re.compile(r"^\s*(/\S*ld-linux\S*)\s+\(0x[0-9a-f]+\)\s*$")


class ElfDepsError(RuntimeError):
    """ldd is missing, or a library cannot be resolved."""


@dataclass
class SharedLibraries:
    libraries: dict[str, Path] = field(default_factory=dict)
    """soname -> the file ldd resolved it to."""
    loader: Path | None = None


def parse_ldd(output: str, what: str) -> tuple[dict[str, Path], Path | None]:
    """The libraries (soname -> path) and loader in one ``ldd`` output."""
    libraries: dict[str, Path] = {}
    loader: Path | None = None
    for line in output.splitlines():
        if match := _MISSING.match(line):
            raise ElfDepsError(f"{what} needs {match.group(1)}, which ldd cannot find")
        if match := _RESOLVED.match(line):
            libraries[match.group(1)] = Path(match.group(2))
        elif match := _LOADER.match(line):
            loader = Path(match.group(1))
    return libraries, loader


def shared_libraries(files: Iterable[Path]) -> SharedLibraries:
    """Every library any of ``files`` needs (ldd already follows the whole tree)."""
    ldd = shutil.which("ldd")
    if ldd is None:
        raise ElfDepsError("ldd (Debian's libc-bin) is needed to build the executor bundle")
    found = SharedLibraries()
    for path in files:
        proc = subprocess.run(
            [ldd, str(path)], capture_output=True, text=True, check=False, timeout=60
        )
        if proc.returncode != 0:
            if "not a dynamic executable" in proc.stdout + proc.stderr:
                continue
            raise ElfDepsError(f"ldd {path} failed: {proc.stderr.strip() or proc.stdout.strip()}")
        libraries, loader = parse_ldd(proc.stdout, str(path))
        found.libraries.update(libraries)
        if loader is not None:
            found.loader = loader
    return found
