"""``python -m orchard.recipes.swe.bundled build [--home DIR]`` (``make swe-tasks``)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from . import BuildError, build, bundled_tasks, data_dir


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m orchard.recipes.swe.bundled")
    sub = parser.add_subparsers(dest="command", required=True)
    make = sub.add_parser("build", help="download the pinned sdists, write instances.jsonl")
    make.add_argument(
        "--home", type=Path, default=None, help="output folder (default $ORCHARD_HOME/recipes/swe)"
    )
    sub.add_parser("list", help="the bundled tasks, one a line")
    args = parser.parse_args(argv)
    if args.command == "list":
        for task in bundled_tasks():
            print(f"{task.instance_id}\t{task.package} {task.version}\t{task.bug}")
        return 0
    try:
        path = build(args.home or data_dir())
    except BuildError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(f"wrote {len(bundled_tasks())} task(s) to {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
