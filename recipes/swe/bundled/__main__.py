"""``python -m orchard.recipes.swe.bundled build [--home DIR]`` (``make swe-tasks``), ``list``,
and ``derive [NAME ...] [--write]``: each task's FAIL_TO_PASS / PASS_TO_PASS made again by
grading it through a running stack's rewards service (``orchard up``; the SDK finds it as
usual) with no change and with the gold patch, from the test statuses the grader parsed
(swebench's own parser), compared with ``tasks.json`` (``--write`` updates it).
"""

from __future__ import annotations

import argparse
import json
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from orchard.recipes.swe.tasks import load_tasks

from orchard import Rewards

from . import (
    HERE,
    UNCHANGED_PATCH,
    BuildError,
    build,
    bundled_tasks,
    data_dir,
    instances_path,
    split_statuses,
)


def derive(names: list[str], write: bool, parallel: int = 4) -> int:
    tasks = load_tasks(instances_path(), "orchard")
    wanted = {t.instance_id for t in bundled_tasks() if not names or t.name in names}
    tasks = [t for t in tasks if t.instance_id in wanted]
    rewards = Rewards()
    jobs = [(t, patch) for t in tasks for patch in (UNCHANGED_PATCH, t.gold_patch)]
    with ThreadPoolExecutor(parallel) as pool:
        reports = list(pool.map(lambda j: rewards.grade(j[0].grading_instance(), j[1]), jobs))
    specs = json.loads((HERE / "tasks.json").read_text())
    by_id = {t.instance_id: spec for t, spec in zip(bundled_tasks(), specs, strict=True)}
    differ = 0
    for i, task in enumerate(tasks):
        before, after = reports[2 * i], reports[2 * i + 1]
        if before.kind != "graded" or after.kind != "graded":
            print(f"{task.instance_id}: not graded ({before.kind}, {after.kind}: {after.reason})")
            differ += 1
            continue
        f2p, p2p = split_statuses(before.test_statuses, after.test_statuses)
        spec = by_id[task.instance_id]
        same = (f2p, p2p) == (spec["FAIL_TO_PASS"], spec["PASS_TO_PASS"])
        differ += not same
        print(f"{task.instance_id}: {len(f2p)} / {len(p2p)} {'as listed' if same else 'DIFFER'}")
        spec["FAIL_TO_PASS"], spec["PASS_TO_PASS"] = f2p, p2p
    if write:
        (HERE / "tasks.json").write_text(json.dumps(specs, indent=1) + "\n")
    return 1 if differ and not write else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m orchard.recipes.swe.bundled")
    sub = parser.add_subparsers(dest="command", required=True)
    make = sub.add_parser("build", help="download the pinned sdists, write instances.jsonl")
    make.add_argument(
        "--home", type=Path, default=None, help="output folder (default $ORCHARD_HOME/recipes/swe)"
    )
    sub.add_parser("list", help="the bundled tasks, one a line")
    again = sub.add_parser("derive", help="FAIL_TO_PASS / PASS_TO_PASS again, via the grader")
    again.add_argument("names", nargs="*", help="task names (default: all)")
    again.add_argument("--write", action="store_true", help="update tasks.json")
    args = parser.parse_args(argv)
    if args.command == "list":
        for task in bundled_tasks():
            print(f"{task.instance_id}\t{task.package} {task.version}\t{task.bug}")
        return 0
    if args.command == "derive":
        return derive(args.names, args.write)
    try:
        path = build(args.home or data_dir())
    except BuildError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(f"wrote {len(bundled_tasks())} task(s) to {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
