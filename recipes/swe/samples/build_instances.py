"""Build ``instances.jsonl`` from the sample task folders (``make rewards-samples`` or by hand).

Each folder holds ``repo/`` (the buggy repository), ``gold.patch``,
``test.patch`` and ``problem.md``. The rows use the default image and the
Orchard ``repo_files`` extension (the image has no repository of its own): the
``orchard`` row format of ``orchard.recipes.swe.tasks`` (``load_tasks(path, "orchard")``).
``mean([5])`` is 2.5 before the fix, so ``test_mean[values1-5]`` is a FAIL_TO_PASS test
(tests/recipes/swe/test_bundled_tasks_live.py runs every list through the grader).
"""

from __future__ import annotations

import json
from pathlib import Path

HERE = Path(__file__).parent

SAMPLES = {
    "calc_divide": {
        "FAIL_TO_PASS": [
            "tests/test_calc.py::test_mean[values0-3]",
            "tests/test_calc.py::test_mean[values1-5]",
            "tests/test_calc.py::test_mean[values2-3]",
        ],
        "PASS_TO_PASS": [
            "tests/test_calc.py::test_add",
            "tests/test_calc.py::test_mean_empty",
        ],
    }
}


def build() -> list[dict[str, object]]:
    rows: list[dict[str, object]] = []
    for name, tests in SAMPLES.items():
        folder = HERE / name
        repo = folder / "repo"
        files = {
            str(p.relative_to(repo)): p.read_text() for p in sorted(repo.rglob("*")) if p.is_file()
        }
        rows.append(
            {
                "instance_id": f"orchard-samples__{name}-1",
                "repo": f"orchard-samples/{name}",
                "problem_statement": (folder / "problem.md").read_text(),
                "patch": (folder / "gold.patch").read_text(),
                "test_patch": (folder / "test.patch").read_text(),
                "FAIL_TO_PASS": json.dumps(tests["FAIL_TO_PASS"]),
                "PASS_TO_PASS": json.dumps(tests["PASS_TO_PASS"]),
                "image": "debian:bookworm",
                "workdir": "/testbed",
                "install_config": {
                    "test_cmd": "python3 -m pytest -rA -p no:cacheprovider tests",
                    "log_parser": "parse_log_pytest",
                },
                "repo_files": files,
            }
        )
    return rows


if __name__ == "__main__":
    rows = build()
    (HERE / "instances.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    print(f"wrote {len(rows)} instance(s) to {HERE / 'instances.jsonl'}")
