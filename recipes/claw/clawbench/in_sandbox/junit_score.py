"""A claw-bench verifier's pytest run, as the score line the Claw grader reads.

``python3 junit_score.py JUNIT_XML PYTEST_OUTPUT EXIT_CODE`` prints the tail of pytest's output,
then one JSON line (the grader reads the last line, ``orchard.recipes.claw.grading``)::

    {"score": passed / counted, "components": {"<test id>": 1.0 | 0.0, ...},
     "passed": n, "failed": n, "errors": n, "skipped": n, "counted": n,
     "all_passed": bool, "exit_code": n, "problem": "..." | null}

``score`` is claw-bench's own (``core/runner.py``: checks passed over checks run); a skipped
test is not counted, a collection error is a failed check, named by the module and the error's
last line (``test_output [does not import: ModuleNotFoundError: No module named 'yaml']``: the
grader keeps component names, so the reason a verifier cannot run survives into the score); ``all_passed`` is claw-bench's
``passed`` (no failure or error, at least one check). No JUnit file, or one that does not
parse (pytest killed by its timeout, a crash), is score 0 with ``problem`` saying so. Why JUnit
and not pytest's text summary, which claw-bench's ``verifier._parse_stdout`` reads: that parser
takes the first number of the line for both counts (``1 failed, 6 passed`` reads as 1 passed),
and counts no errors.
"""

from __future__ import annotations

import json
import sys
import xml.etree.ElementTree as ET

OUTPUT_TAIL = 3000


def score(junit_path: str, exit_code: int) -> dict[str, object]:
    components: dict[str, float] = {}
    counts = {"passed": 0, "failed": 0, "errors": 0, "skipped": 0}
    problem = None
    try:
        root = ET.parse(junit_path).getroot()
    except (OSError, ET.ParseError) as err:
        root, problem = None, f"no JUnit report ({type(err).__name__}: {err})"
    for case in root.iter("testcase") if root is not None else ():
        name = f"{case.get('classname', '')}::{case.get('name', '')}".lstrip(":")
        if case.find("skipped") is not None:
            counts["skipped"] += 1
            continue
        error = case.find("error")
        if error is not None:
            kind = "errors"
            if not case.get("classname"):  # the module itself did not import
                lines = [line for line in (error.text or "").splitlines() if line.strip()]
                why = lines[-1].strip().removeprefix("E").strip() if lines else "?"
                name = f"{name} [does not import: {why[:200]}]"
        elif case.find("failure") is not None:
            kind = "failed"
        else:
            kind = "passed"
        counts[kind] += 1
        while name in components:
            name += "'"
        components[name] = 1.0 if kind == "passed" else 0.0
    counted = counts["passed"] + counts["failed"] + counts["errors"]
    if root is not None and counted == 0:
        problem = "the verifier ran no check"
    return {
        "score": round(counts["passed"] / counted, 6) if counted else 0.0,
        "components": components,
        **counts,
        "counted": counted,
        "all_passed": counted > 0 and counts["passed"] == counted,
        "exit_code": exit_code,
        "problem": problem,
    }


def main(argv: list[str]) -> int:
    junit, output, code = argv[1], argv[2], int(argv[3])
    try:
        with open(output, errors="replace") as f:
            text = f.read()
    except OSError:
        text = ""
    if text:
        print(text[-OUTPUT_TAIL:].rstrip())
    print(json.dumps(score(junit, code), sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
