"""Grading parity with the ``swebench`` package (5.x) on the same logs.

Logs: the real corpus in ``corpus/logs`` (real suites run in real sandboxes by
``corpus/make_corpus.py``) and the hand-made cases in ``handmade_logs.py``.
Every log is read with every parser both sides share, and graded against the
corpus's instances plus instances derived from the log itself (first passing
ids as FAIL_TO_PASS, a skipped id as FAIL_TO_PASS, a truncated parametrised
id, a missing id, both eval types). For each: the status map, "gradable",
the FAIL_TO_PASS / PASS_TO_PASS success and failure lists and "resolved" must
be identical.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from orchard.rewards.swe.grading import EvalType, grade_statuses, read_log

from .handmade_logs import HANDMADE

swebench_grading = pytest.importorskip("swebench.harness.grading")
from swebench.types import TestSpec as SweSpec  # noqa: E402

CORPUS = Path(__file__).parent / "corpus"
PARSERS = {  # ours -> swebench's
    "pytest": "parse_log_pytest",
    "pytest_options": "parse_log_pytest_options",
    "pytest_v2": "parse_log_pytest_v2",
    "django": "parse_log_django",
    "sympy": "parse_log_sympy",
    "matplotlib": "parse_log_matplotlib",
    "seaborn": "parse_log_seaborn",
    "gotest": "parse_log_gotest",
    "cargo": "parse_log_cargo",
    "jest": "parse_log_jest",
}


def _logs() -> dict[str, str]:
    logs = {f"corpus/{p.name}": p.read_text() for p in sorted((CORPUS / "logs").glob("*.log"))}
    logs.update({f"handmade/{k}": v for k, v in HANDMADE.items()})
    return logs


LOGS = _logs()
MANIFEST: dict[str, Any] = json.loads((CORPUS / "instances.json").read_text())


def _instances(statuses: dict[str, str]) -> list[tuple[list[str], list[str]]]:
    ids = list(statuses)
    passing = [t for t in ids if statuses[t] in ("PASSED", "XFAIL")]
    skipped = [t for t in ids if statuses[t] == "SKIPPED"]
    truncated = [t.split(" ")[0] for t in ids if "[" in t and " " in t.split("[", 1)[1]]
    out = [(passing[:3], passing[3:]), (ids[:2], ids[2:]), (["not.a.real::test"], passing[:2])]
    out += [(skipped[:1] + passing[:1], skipped[1:])] if skipped else []
    out += [(truncated[:2], passing[:2])] if truncated else []
    out += [([t[:-1] + "[" for t in ids[:1]], ids[1:2])] if ids else []
    for entry in MANIFEST.values():
        out.append((entry["FAIL_TO_PASS"], entry["PASS_TO_PASS"]))
    return out


def _theirs(
    tmp_path: Path, log: str, parser: str, f2p: list[str], p2p: list[str], eval_type: str
) -> tuple[dict[str, str], bool, dict[str, Any]]:
    spec = SweSpec(
        instance_id="x", image="", eval_script_list=[], repo="", version="",
        FAIL_TO_PASS=f2p, PASS_TO_PASS=p2p, log_parser=parser, eval_type=eval_type,
    )  # fmt: skip
    path = tmp_path / "log.txt"
    path.write_text(log)
    statuses, found = swebench_grading.get_logs_eval(spec, str(path))
    report = swebench_grading.get_eval_report(
        spec, {"instance_id": "x", "model_patch": "diff"}, str(path), include_tests_status=True
    )["x"]
    return statuses, found, report


@pytest.mark.parametrize("log_name", sorted(LOGS))
def test_grading_matches_swebench(log_name: str, tmp_path: Path) -> None:
    log = LOGS[log_name]
    compared = 0
    for ours, theirs in PARSERS.items():
        verdict = read_log(log, ours)
        their_map, their_found = swebench_grading.get_logs_eval(
            SweSpec("x", "", [], "", "", [], [], log_parser=theirs), _write(tmp_path, log)
        )
        assert (verdict.statuses, verdict.gradable) == (their_map, their_found), (
            ours,
            verdict.reason,
        )
        for f2p, p2p in _instances(verdict.statuses):
            for eval_type in EvalType:
                _, _, report = _theirs(tmp_path, log, theirs, f2p, p2p, eval_type.value)
                assert report["patch_successfully_applied"] == verdict.gradable
                if not verdict.gradable:
                    assert report["resolved"] is False
                    continue
                mine = grade_statuses(verdict.statuses, f2p, p2p, eval_type)
                status = report["tests_status"]
                assert mine.fail_to_pass.success == status["FAIL_TO_PASS"]["success"], (ours, f2p)
                assert mine.fail_to_pass.failure == status["FAIL_TO_PASS"]["failure"], (ours, f2p)
                assert mine.pass_to_pass.success == status["PASS_TO_PASS"]["success"], (ours, p2p)
                assert mine.pass_to_pass.failure == status["PASS_TO_PASS"]["failure"], (ours, p2p)
                assert mine.resolved == report["resolved"], (ours, f2p, p2p)
                compared += 1
    assert compared or not any(read_log(log, p).gradable for p in PARSERS)


def _write(tmp_path: Path, log: str) -> str:
    path = tmp_path / "plain.txt"
    path.write_text(log)
    return str(path)


def test_corpus_is_real_and_discriminating() -> None:
    """The corpus has real fixed/buggy pairs: fixed resolves its instance, buggy does not."""
    assert set(MANIFEST) >= {"django", "sympy", "six", "more_itertools"}
    for name, entry in MANIFEST.items():
        assert entry["FAIL_TO_PASS"], name
        assert len(entry["PASS_TO_PASS"]) > 10, name
        fixed, buggy = (
            read_log((CORPUS / "logs" / n).read_text(), entry["parser"]) for n in entry["logs"]
        )
        assert fixed.gradable and buggy.gradable, name
        assert grade_statuses(
            fixed.statuses, entry["FAIL_TO_PASS"], entry["PASS_TO_PASS"]
        ).resolved, name
        assert not grade_statuses(
            buggy.statuses, entry["FAIL_TO_PASS"], entry["PASS_TO_PASS"]
        ).resolved, name
