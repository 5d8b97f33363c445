"""``python -m orchard.executor.bundle build [--home H] [--out DIR] [--tarball FILE]``.

Builds the executor bundle (or reuses the cached one under
``<home>/bundles/<digest>/``), optionally copies it to DIR and packs it into
FILE (.tar.gz), then prints one JSON line: the cached path, digest, size.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from ..initbin import InitBuildError
from .builder import BundleBuildError, bundle_size, copy_bundle, ensure_bundle, write_tarball
from .elf_deps import ElfDepsError


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m orchard.executor.bundle", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    build = sub.add_parser("build", help="build (or reuse) the bundle")
    build.add_argument("--home", type=Path, default=None, help="node home (default $ORCHARD_HOME)")
    build.add_argument("--out", type=Path, default=None, help="also copy the bundle here")
    build.add_argument("--tarball", type=Path, default=None, help="also write it as a .tar.gz")
    build.add_argument("--no-pyc", action="store_true", help="leave out __pycache__ (smaller)")
    args = parser.parse_args(argv)
    started = time.monotonic()
    try:
        bundle = ensure_bundle(args.home, pyc=not args.no_pyc)
        if args.out is not None:
            copy_bundle(bundle, args.out)
        if args.tarball is not None:
            write_tarball(bundle, args.tarball)
    except (BundleBuildError, ElfDepsError, InitBuildError, OSError) as exc:
        print(f"bundle build failed: {exc}", file=sys.stderr)
        return 1
    report = {
        "bundle": str(bundle),
        "digest": bundle.name,
        "size_bytes": bundle_size(bundle),
        "seconds": round(time.monotonic() - started, 2),
    }
    if args.out is not None:
        report["out"] = str(args.out)
    if args.tarball is not None:
        report["tarball"] = str(args.tarball)
        report["tarball_bytes"] = args.tarball.stat().st_size
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
