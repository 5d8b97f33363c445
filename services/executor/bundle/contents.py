"""What goes into the executor bundle: a list of (source file, place in the bundle).

Collected from the running interpreter (this machine's CPython, whatever the
venv points at), never downloaded:

- ``bin/python3``: the interpreter binary; ``lib/``: every shared library it
  and its extension modules need (``ldd``) plus the dynamic loader as
  ``lib/ld-linux-x86-64.so.2``;
- ``lib/python3.X/``: the stdlib without what an executor never imports
  (tests, tkinter, idle, ensurepip, lib2to3, the static libpython under
  ``config-*``, site-packages) and ``lib-dynload`` without test modules;
- ``site/``: the executor's third-party distributions (grpcio, grpcio-health-checking, protobuf,
  uvloop, structlog, opentelemetry, prometheus-client and what they require), copied file by file from their
  installed RECORDs, and the three orchard packages the executor imports
  (``orchard.executor``, ``orchard.common``, ``orchard._proto``) under a
  bare ``orchard/__init__.py`` (the real one imports the SDK).
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import sys
import sysconfig
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from packaging.requirements import Requirement

from .elf_deps import shared_libraries

# What the executor and orchard.common import (the build imports the executor
# with the bundled python, so a missing one fails the build, not a sandbox).
EXECUTOR_DISTRIBUTIONS = (
    "grpcio",
    "grpcio-health-checking",
    "protobuf",
    "uvloop",
    "structlog",
    "opentelemetry-api",
    "opentelemetry-sdk",
    "prometheus-client",
)
ORCHARD_PACKAGES = ("orchard.executor", "orchard.common", "orchard._proto")
LOADER_NAME = "ld-linux-x86-64.so.2"

# Top-level stdlib entries an executor never imports.
STDLIB_SKIP = frozenset(
    {
        "site-packages",
        "test",
        "idlelib",
        "tkinter",
        "turtledemo",
        "turtle.py",
        "ensurepip",
        "lib2to3",
        "pydoc_data",
        "venv",
        "distutils",
        "__phello__",
        "__hello__.py",
        "LICENSE.txt",
        "curses",
        "dbm",
        "sqlite3",
    }
)
# Nested folders that are only tests.
SKIP_DIR_NAMES = frozenset({"__pycache__", "tests", "test", "idle_test"})
SKIP_SUFFIXES = (".pyc", ".pyo", ".a", ".exe")
# Test modules, and the modules of the packages skipped above (they would pull
# in ncurses, readline, gdbm, sqlite and Kerberos through libnsl).
DYNLOAD_SKIP_PREFIXES = (
    "_test",
    "_xx",
    "xx",
    "_ctypes_test",
    "_tkinter",
    "_curses",
    "readline",
    "_dbm",
    "_gdbm",
    "nis",
    "_sqlite3",
)


@dataclass(frozen=True)
class BundleFile:
    source: Path
    dest: str
    """Path inside the bundle, ``/``-separated."""


def python_version_dir() -> str:
    return f"python{sys.version_info.major}.{sys.version_info.minor}"


def interpreter_binary() -> Path:
    """The real interpreter the venv runs (a venv's python is a symlink to it)."""
    return Path(sys.executable).resolve()


def _walk(root: Path, skip_top: frozenset[str] = frozenset()) -> Iterator[Path]:
    for entry in sorted(root.iterdir()):
        if entry.name in skip_top or entry.name in SKIP_DIR_NAMES:
            continue
        if entry.name.startswith("config-") and entry.is_dir():
            continue
        if entry.is_dir() and not entry.is_symlink():
            yield from _walk(entry)
        elif entry.is_file() and not entry.name.endswith(SKIP_SUFFIXES):
            yield entry


def stdlib_files() -> list[BundleFile]:
    stdlib = Path(sysconfig.get_paths(vars={"base": sys.base_prefix})["stdlib"])
    dest_root = f"lib/{python_version_dir()}"
    files: list[BundleFile] = []
    for path in _walk(stdlib, STDLIB_SKIP):
        rel = path.relative_to(stdlib)
        if rel.parts[0] == "lib-dynload" and rel.name.startswith(DYNLOAD_SKIP_PREFIXES):
            continue
        files.append(BundleFile(path, f"{dest_root}/{rel.as_posix()}"))
    return files


def _distribution_closure(names: tuple[str, ...]) -> list[importlib.metadata.Distribution]:
    """The distributions and everything they require (for this Python, no extras)."""
    seen: dict[str, importlib.metadata.Distribution] = {}
    todo = list(names)
    while todo:
        name = todo.pop()
        key = name.lower().replace("_", "-")
        if key in seen:
            continue
        dist = importlib.metadata.distribution(name)
        seen[key] = dist
        for text in dist.requires or []:
            req = Requirement(text)
            if req.marker is None or req.marker.evaluate({"extra": ""}):
                todo.append(req.name)
    return [seen[k] for k in sorted(seen)]


def distribution_files() -> list[BundleFile]:
    files: list[BundleFile] = []
    for dist in _distribution_closure(EXECUTOR_DISTRIBUTIONS):
        for record in dist.files or []:
            rel = Path(str(record))
            if rel.parts[0] == ".." or SKIP_DIR_NAMES.intersection(rel.parts):
                continue
            if rel.name.endswith(SKIP_SUFFIXES):
                continue
            source = Path(str(dist.locate_file(record)))
            if source.is_file():
                files.append(BundleFile(source, f"site/{rel.as_posix()}"))
    return files


def orchard_files() -> list[BundleFile]:
    files: list[BundleFile] = []
    for package in ORCHARD_PACKAGES:
        spec = importlib.util.find_spec(package)
        if spec is None or not spec.submodule_search_locations:
            raise RuntimeError(f"cannot find the package {package}")
        root = Path(next(iter(spec.submodule_search_locations)))
        dest = "site/" + package.replace(".", "/")
        for path in _walk(root):
            rel = path.relative_to(root)
            # The builder itself and the C sources are not needed inside.
            if package == "orchard.executor" and rel.parts[0] in ("bundle", "init"):
                continue
            if path.suffix in (".py", ".pyi") or path.name == "py.typed":
                files.append(BundleFile(path, f"{dest}/{rel.as_posix()}"))
    return files


def native_files(python_files: list[BundleFile]) -> list[BundleFile]:
    """The interpreter, and every library it and the extension modules need."""
    python = interpreter_binary()
    extensions = [f.source for f in python_files if f.source.name.endswith(".so")]
    libs = shared_libraries([python, *extensions])
    if libs.loader is None:
        raise RuntimeError(f"ldd named no dynamic loader for {python}")
    files = [BundleFile(python, "bin/python3"), BundleFile(libs.loader, f"lib/{LOADER_NAME}")]
    for soname, path in sorted(libs.libraries.items()):
        files.append(BundleFile(path, f"lib/{soname}"))
    return files


def collect() -> list[BundleFile]:
    """Everything the bundle holds but the two C programs and bundle.json."""
    python_files = stdlib_files() + distribution_files() + orchard_files()
    return native_files(python_files) + python_files
