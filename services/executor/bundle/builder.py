"""Build the executor bundle into a content-addressed cache and copy it out.

The digest covers every input: the bundle's file list with each source's
size and mtime (system files: the interpreter, libraries, stdlib, installed
distributions), the full bytes of the orchard sources and of the two C
programs, and the builder's own version. A changed input is a new
``<home>/bundles/<digest>/``; an existing one is reused at once. A build
writes a temporary folder and renames it into place, so concurrent builders
race harmlessly and a half-built bundle is never used.

Native files are stripped of debug symbols when ``strip`` (binutils) is
there; .py files get ``__pycache__`` compiled with unchecked hashes (the
bundle is read-only and never changes, so Python need not stat sources).
"""

from __future__ import annotations

import compileall
import hashlib
import json
import os
import py_compile
import shutil
import subprocess
import sys
import tarfile
from importlib import resources
from pathlib import Path

from orchard.common.layout import NodeLayout, orchard_home

from ..initbin import CFLAGS, ensure_init_binary, init_source
from .contents import LOADER_NAME, BundleFile, collect, python_version_dir

BUILDER_VERSION = "1"
ENTRY_SOURCE = "orchard_entry.c"
MANIFEST = "bundle.json"
EXECUTOR_PACKAGES_PREFIX = "site/orchard/"


class BundleBuildError(RuntimeError):
    """A tool is missing or a step of the build failed."""


def entry_source() -> bytes:
    return (resources.files("orchard.executor.bundle") / ENTRY_SOURCE).read_bytes()


def bundles_dir(home: Path | None = None) -> Path:
    return NodeLayout(home if home is not None else orchard_home()).home / "bundles"


def bundle_digest(files: list[BundleFile], *, pyc: bool) -> str:
    h = hashlib.sha256()
    h.update(f"builder {BUILDER_VERSION} pyc={pyc} {sys.version}\n".encode())
    h.update(hashlib.sha256(entry_source()).digest())
    h.update(hashlib.sha256(init_source()).digest())
    for f in files:
        st = f.source.stat()
        h.update(f"{f.dest}\0{f.source}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
        if f.dest.startswith(EXECUTOR_PACKAGES_PREFIX):
            h.update(hashlib.sha256(f.source.read_bytes()).digest())
    return h.hexdigest()[:16]


def ensure_bundle(home: Path | None = None, *, pyc: bool = True) -> Path:
    """The bundle for the current inputs under ``<home>/bundles/``, built if missing."""
    files = collect()
    digest = bundle_digest(files, pyc=pyc)
    cache = bundles_dir(home)
    target = cache / digest
    if (target / MANIFEST).is_file():
        return target
    cache.mkdir(parents=True, exist_ok=True)
    tmp = cache / f".build-{os.getpid()}-{digest}"
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        _build(tmp, files, digest, home, pyc=pyc)
        try:
            os.rename(tmp, target)
        except OSError:
            if not (target / MANIFEST).is_file():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def _build(
    out: Path, files: list[BundleFile], digest: str, home: Path | None, *, pyc: bool
) -> None:
    strip = shutil.which("strip")
    for f in files:
        dest = out / f.dest
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(f.source, dest)
        native = f.dest.startswith(("bin/", "lib/lib", f"lib/{LOADER_NAME}")) or f.dest.endswith(
            ".so"
        )
        dest.chmod(0o755 if native else 0o644)
        # The loader and libc keep their symbols (gdb, and the loader's own
        # relocation needs nothing stripped from it; it is small anyway).
        if native and strip and f.dest != f"lib/{LOADER_NAME}":
            subprocess.run([strip, "--strip-unneeded", str(dest)], check=False, capture_output=True)
    (out / "site" / "orchard" / "__init__.py").write_text(
        '"""orchard inside the executor bundle: only the executor, common and _proto."""\n'
    )
    _compile_c(entry_source(), ENTRY_SOURCE, out / "bin" / "orchard-entry")
    shutil.copyfile(ensure_init_binary(home), out / "bin" / "orchard-init")
    (out / "bin" / "orchard-init").chmod(0o755)
    if pyc:
        # The result is ignored on purpose: a few stdlib files (templates, the
        # py2-only bits of lib2to3-era modules) do not compile; they are never
        # imported, and Python would fall back to the source anyway.
        for folder in (out / "lib" / python_version_dir(), out / "site"):
            compileall.compile_dir(
                folder,
                quiet=2,
                workers=1,
                invalidation_mode=py_compile.PycInvalidationMode.UNCHECKED_HASH,
            )
    manifest = {
        "format": 1,
        "digest": digest,
        "python": ".".join(map(str, sys.version_info[:3])),
        "loader": f"lib/{LOADER_NAME}",
        "interpreter": "bin/python3",
        "entry": "bin/orchard-entry",
        "init": "bin/orchard-init",
        "pythonhome": ".",
        "pythonpath": "site",
    }
    _check_imports(out)
    (out / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")


SMOKE_IMPORTS = "import orchard.executor.__main__, orchard.executor.server, orchard.executor.files"


def bundled_python_argv(bundle: Path, *args: str) -> list[str]:
    """How to run the bundle's python with nothing from the host or image."""
    return [
        str(bundle / "lib" / LOADER_NAME),
        "--library-path",
        str(bundle / "lib"),
        str(bundle / "bin" / "python3"),
        "-B",
        "-s",
        *args,
    ]


def bundled_python_env(bundle: Path) -> dict[str, str]:
    """The environment orchard-entry gives the executor (see orchard_entry.c)."""
    return {
        "PYTHONHOME": str(bundle),
        "PYTHONPATH": str(bundle / "site"),
        "PYTHONNOUSERSITE": "1",
        "PYTHONDONTWRITEBYTECODE": "1",
        "PYTHONSAFEPATH": "1",
        "PYTHONUTF8": "1",
        "PYTHONCOERCECLOCALE": "0",
        "LC_ALL": "C",
    }


def _check_imports(bundle: Path) -> None:
    """Import the executor with the bundle's own python: a missing package fails here, not
    inside a sandbox."""
    proc = subprocess.run(
        bundled_python_argv(bundle, "-c", SMOKE_IMPORTS),
        env=bundled_python_env(bundle),
        cwd="/",
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    if proc.returncode != 0:
        raise BundleBuildError(f"the bundled python cannot import the executor:\n{proc.stderr}")


def _compile_c(source: bytes, name: str, output: Path) -> None:
    gcc = shutil.which("gcc")
    if gcc is None:
        raise BundleBuildError("gcc is needed to build orchard-entry but is not installed")
    src = output.with_name(name)
    src.write_bytes(source)
    try:
        result = subprocess.run(
            [gcc, *CFLAGS, "-o", str(output), str(src)], capture_output=True, text=True, check=False
        )
    finally:
        src.unlink()
    if result.returncode != 0:
        raise BundleBuildError(f"gcc failed to build {name}:\n{result.stderr}")
    output.chmod(0o755)


def copy_bundle(bundle: Path, out: Path) -> Path:
    """Copy a built bundle to ``out`` (which must not exist); it stays relocatable."""
    if out.exists():
        raise BundleBuildError(f"{out} already exists")
    shutil.copytree(bundle, out, symlinks=True)
    return out


def write_tarball(bundle: Path, tarball: Path) -> Path:
    """``tarball`` (.tar.gz): the bundle's contents at the archive's top level."""
    tmp = tarball.with_name(f".{tarball.name}.{os.getpid()}")
    with tarfile.open(tmp, "w:gz", compresslevel=6) as tar:
        for entry in sorted(bundle.iterdir()):
            tar.add(entry, arcname=entry.name)
    os.replace(tmp, tarball)
    return tarball


def bundle_size(bundle: Path) -> int:
    return sum(p.stat().st_size for p in bundle.rglob("*") if p.is_file() and not p.is_symlink())
