"""``python -m orchard.scheduler.tools build|path``: build a tools layer, or say where it is."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from .build import ToolsBuildError, build_layer
from .layers import DEFAULT_LAYERS, LAYERS, ToolsLayerError, built_layer, tools_dir_from_env


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m orchard.scheduler.tools")
    sub = parser.add_subparsers(dest="command", required=True)
    for name, text in (("build", "build the layer (cached by its pins)"), ("path", "print it")):
        cmd = sub.add_parser(name, help=text)
        cmd.add_argument("--tools-dir", type=Path, default=None)
        cmd.add_argument("--layer", choices=sorted(LAYERS), default=DEFAULT_LAYERS[0])
        if name == "build":
            cmd.add_argument("--force", action="store_true", help="rebuild even if cached")
    args = parser.parse_args(argv)
    tools_dir: Path = args.tools_dir or tools_dir_from_env()
    if args.command == "path":
        try:
            print(built_layer(tools_dir, args.layer))
        except ToolsLayerError as err:
            print(err.message, file=sys.stderr)
            return 1
        return 0
    started = time.monotonic()
    try:
        folder, meta = build_layer(
            LAYERS[args.layer],
            tools_dir,
            force=args.force,
            log=lambda msg: print(f"tools layer {args.layer}: {msg}", file=sys.stderr, flush=True),
        )
    except ToolsBuildError as err:
        print(f"tools layer {args.layer}: build failed: {err}", file=sys.stderr)
        return 1
    print(
        f"{args.layer}: {folder} ({meta.get('size_bytes', 0) / 1e6:.0f} MB, built in "
        f"{meta.get('build_seconds', 0)} s; this call {time.monotonic() - started:.1f} s)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
