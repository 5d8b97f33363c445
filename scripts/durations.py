"""Seconds per unit of make test's parallel phase, from the JUnit reports of a run.

    .venv/bin/python scripts/durations.py build/test-results/parallel.xml > tests/durations.json

``scripts/run_tests.sh`` writes one report per phase; the parallel phase's scheduler
(tests/phases.py) hands out the units longest first by these seconds. A unit is a test
file, or a group of files (``GROUPS`` in tests/phases.py); its seconds are the sum of its
tests' setup, call and teardown (what pytest's JUnit report counts per test case). Only
the order of the run depends on this file: a stale one orders it less well, nothing more.
Written by us: pytest-split reads its own format and schedules by test, not by file.
"""

from __future__ import annotations

import argparse
import json
import sys
import xml.etree.ElementTree as ET
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.phases import unit_of  # noqa: E402


def file_of_class(classname: str, root: Path = ROOT) -> str:
    """``tests.e2e.test_cli`` or ``tests.e2e.test_cli.TestX`` -> ``tests/e2e/test_cli.py``."""
    parts = classname.split(".")
    for end in range(len(parts), 0, -1):
        path = "/".join(parts[:end]) + ".py"
        if (root / path).is_file():
            return path
    raise ValueError(f"no test file for the JUnit class name {classname!r}")


def unit_seconds(reports: list[Path], root: Path = ROOT) -> dict[str, float]:
    seconds: dict[str, float] = defaultdict(float)
    for report in reports:
        for case in ET.parse(report).getroot().iter("testcase"):
            classname = case.get("classname")
            if not classname:
                continue  # a collection error has no test case to time
            seconds[unit_of(file_of_class(classname, root))] += float(case.get("time") or 0.0)
    return dict(seconds)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("reports", nargs="+", type=Path, help="JUnit XML reports")
    args = parser.parse_args(argv)
    try:
        seconds = unit_seconds(args.reports)
    except (OSError, ET.ParseError, ValueError) as err:
        print(f"test_durations: {err}", file=sys.stderr)
        return 1
    rounded = {unit: round(value, 1) for unit, value in sorted(seconds.items())}
    print(json.dumps(rounded, indent=1, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
