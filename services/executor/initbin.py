"""Build the sandbox init binary (``orchard-init``) on demand and cache it.

The C source ships as package data; the binary is compiled with the node's gcc
into ``<home>/bin/orchard-init-<sha256 of the source[:12]>``, so a changed
source gets a new name and a running sandbox's bind-mounted binary is never
overwritten. Compilation writes a temporary file and renames it into place, so
concurrent callers race harmlessly.

``python -m orchard.executor.initbin [--home H]`` prints the binary's path.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import subprocess
import sys
from importlib import resources
from pathlib import Path

from orchard.common.layout import NodeLayout, orchard_home

SOURCE_NAME = "orchard_init.c"
CFLAGS = ("-static", "-O2", "-s", "-Wall", "-Wextra", "-Werror")


class InitBuildError(RuntimeError):
    """gcc is missing or refused the source."""


def init_source() -> bytes:
    """The C source of orchard-init, as shipped with this package."""
    return (resources.files("orchard.executor") / "init" / SOURCE_NAME).read_bytes()


def binary_path(home: Path | None = None) -> Path:
    """Where the binary for the current source lives (built or not)."""
    layout = NodeLayout(home if home is not None else orchard_home())
    digest = hashlib.sha256(init_source()).hexdigest()[:12]
    return layout.home / "bin" / f"orchard-init-{digest}"


def ensure_init_binary(home: Path | None = None) -> Path:
    """Return the path of a built orchard-init, compiling it if needed."""
    target = binary_path(home)
    if target.is_file() and os.access(target, os.X_OK):
        return target
    gcc = shutil.which("gcc")
    if gcc is None:
        raise InitBuildError("gcc is needed to build orchard-init but is not installed")
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp_dir = target.parent / f".build-{os.getpid()}-{target.name}"
    tmp_dir.mkdir(exist_ok=True)
    try:
        source = tmp_dir / SOURCE_NAME
        source.write_bytes(init_source())
        output = tmp_dir / "orchard-init"
        result = subprocess.run(
            [gcc, *CFLAGS, "-o", str(output), str(source)],
            capture_output=True,
            text=True,
            check=False,
        )
        if result.returncode != 0:
            raise InitBuildError(f"gcc failed to build orchard-init:\n{result.stderr}")
        output.chmod(0o755)
        os.replace(output, target)
    finally:
        shutil.rmtree(tmp_dir, ignore_errors=True)
    return target


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Build orchard-init and print its path.")
    parser.add_argument("--home", type=Path, default=None, help="node home (default $ORCHARD_HOME)")
    args = parser.parse_args(argv)
    try:
        path = ensure_init_binary(args.home)
    except InitBuildError as exc:
        print(exc, file=sys.stderr)
        return 1
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
