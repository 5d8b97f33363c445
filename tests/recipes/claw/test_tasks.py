"""The Claw task format: validation with errors naming the task and the field, JSON round
trips, loading and saving files and directories."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from orchard.recipes.claw.tasks import (
    ClawTask,
    TaskFormatError,
    file_bytes,
    load_tasks,
    save_tasks,
    task_json_schema,
)

from .taskdata import REPLY, task


def test_round_trip_is_exact() -> None:
    loaded = ClawTask.from_json(REPLY)
    again = ClawTask.from_json(json.loads(json.dumps(loaded.to_json())))
    assert again == loaded
    # operators serialise as the one operator given, so the JSON reloads
    comp = loaded.to_json()["grader"]["components"][0]["checks"][0]["where"]
    assert comp == {
        "folder": "sent",
        "to": {"contains": "alice@example.com"},
        "subject": {"regex": "^re:"},
    }


def test_json_text_is_accepted() -> None:
    assert ClawTask.from_json(json.dumps(REPLY)).id == "mail-reply-1"


def _error(obj: Any) -> TaskFormatError:
    with pytest.raises(TaskFormatError) as info:
        ClawTask.from_json(obj)
    return info.value


@pytest.mark.parametrize(
    ("changes", "field", "reason"),
    [
        ({"id": "has space"}, "id", "an id is"),
        ({"category": "Mail!"}, "category", "pattern"),
        ({"prompt": ""}, "prompt", "at least 1"),
        ({"services": ["mail", "fax"]}, "services", "unknown service"),
        ({"services": ["mail", "mail"]}, "services", "named twice"),
        ({"services": ["todo"]}, "(task)", "services without fixtures (not started): todo"),
        (
            {"fixtures": {"mail": {"messages": [{"id": "m1"}]}}},
            "fixtures.mail.messages.0.sender",
            "Field required",
        ),
        ({"fixtures": {"mial": {}}}, "fixtures.mial", "Extra inputs"),
        ({"oracle": {"kind": "wish"}}, "oracle", "does not match any of the expected tags"),
        ({"max_steps": 0}, "max_steps", "greater than or equal to 1"),
        ({"surprise": 1}, "surprise", "Extra inputs"),
    ],
)
def test_bad_fields_are_named(changes: dict[str, Any], field: str, reason: str) -> None:
    err = _error(task(**changes))
    assert err.task == (changes.get("id") or "mail-reply-1")
    assert err.field == field, err
    assert reason in err.reason, err


def _grader_with(check: dict[str, Any]) -> dict[str, Any]:
    return task(grader={"kind": "checks", "components": [{"name": "c", "checks": [check]}]})


@pytest.mark.parametrize(
    ("check", "where", "reason"),
    [
        ({"kind": "state", "path": "mail..sent"}, "path", "dotted path"),
        ({"kind": "state", "path": "mail.sent", "where": {"a b": 1}}, "where", "dotted field path"),
        ({"kind": "audit", "where": {"x": {"regex": "("}}}, "regex", "regular expression"),
        (
            {"kind": "audit", "where": {"x": {"contains": "a", "regex": "b"}}},
            "where",
            "exactly one",
        ),
        ({"kind": "audit", "where": {"x": {"at": "tomorrow"}}}, "at", "ISO-8601"),
        ({"kind": "audit", "count": {"min": 3, "max": 1}}, "count", "below min"),
        ({"kind": "all_of", "checks": []}, "checks", "at least 1"),
        ({"kind": "stat", "path": "a"}, "checks.0", "expected tags"),
    ],
)
def test_bad_checks_are_named(check: dict[str, Any], where: str, reason: str) -> None:
    err = _error(_grader_with(check))
    assert err.field.startswith("grader."), err
    assert where in err.field, err
    assert reason in err.reason, err


@pytest.mark.parametrize(
    ("pattern", "reason"),
    [
        (r"(a)\1", r"invalid escape sequence: \1"),  # a backreference
        (r"(?P<x>a)(?P=x)", "invalid perl operator: (?P"),  # a named one
        ("fine(?=ly)", "invalid perl operator: (?="),  # lookahead
        ("fine(?!ly)", "invalid perl operator: (?!"),
        ("(?<=re: )x", "invalid perl operator: (?<="),  # lookbehind
        ("(?<!not )fine", "invalid perl operator: (?<!"),
        ("(?>a+)b", "invalid perl operator: (?>"),  # atomic group (Python 3.11's)
        ("a*+b", "bad repetition operator: *+"),  # possessive
        (r"done\Z", r"invalid escape sequence: \Z"),  # RE2 spells it \z
        ("a{1001}", "invalid repetition size"),
        ("x" * 1001, "a pattern of 1001 characters, over 1000"),
        ("[^@]{1,255}", "compiles to 2298 RE2 instructions, over 2000"),
    ],
)
def test_a_regex_re2_cannot_run_is_refused_naming_the_field(
    tmp_path: Path, pattern: str, reason: str
) -> None:
    """The grader runs every regex on RE2 (linear time, so no backreferences or lookarounds):
    what it cannot run, or what is over a bound, is refused when the file is loaded, with the
    file, the field and RE2's reason, not when a trial is graded."""
    check = {"kind": "state", "path": "mail.messages",
             "where": {"body": {"not": {"regex": pattern}}}}  # fmt: skip
    path = tmp_path / "t.json"
    path.write_text(json.dumps(_grader_with(check)))
    with pytest.raises(TaskFormatError) as info:
        load_tasks(path)
    err = info.value
    assert err.source == str(path) and err.task == "mail-reply-1"
    assert err.field.startswith("grader.") and err.field.endswith(".where.body.not.regex"), err
    assert reason in err.reason, err
    if "RE2 runs" in err.reason:
        assert "no backreferences or lookarounds" in err.reason


def test_regexes_re2_runs_are_kept_as_written() -> None:
    patterns = [
        "^re:",
        r"(?P<n>\d+) items",
        r"\pL+ \z",
        "(?i)caf\u00e9",
        "[[:alpha:]]{2,}",
        "(a+)+$",
    ]
    checks = [{"kind": "answer", "match": {"regex": p}} for p in patterns]
    loaded = ClawTask.from_json(
        task(grader={"kind": "checks", "components": [{"name": "c", "checks": checks}]})
    )
    written = loaded.to_json()["grader"]["components"][0]["checks"]
    assert [c["match"]["regex"] for c in written] == patterns


def test_component_names_unique_and_safety_services_known() -> None:
    comp = {"name": "same", "checks": [{"kind": "answer", "match": "x"}]}
    err = _error(task(grader={"kind": "checks", "components": [comp, comp]}))
    assert "component names repeat: same" in err.reason
    grader = dict(REPLY["grader"], safety=[{"kind": "only_services", "services": ["fax"]}])
    assert "unknown service" in _error(task(grader=grader)).reason


def test_not_an_object_and_not_json() -> None:
    assert _error([1, 2]).field == "(task)"
    err = _error("{nope")
    assert err.task == "?" and "not valid JSON" in err.reason


def test_file_paths_and_contents() -> None:
    env = {"files": {"/workspace/a.txt": "hi", "/workspace/b.bin": {"base64": "AAEC"}}}
    loaded = ClawTask.from_json(task(environment=env))
    assert file_bytes(loaded.environment.files["/workspace/b.bin"]) == b"\x00\x01\x02"
    assert file_bytes(loaded.environment.files["/workspace/a.txt"]) == b"hi"
    for bad in ("relative.txt", "/workspace/../etc/passwd"):
        err = _error(task(environment={"files": {bad: "x"}}))
        assert err.field == "environment.files" and "absolute" in err.reason
    err = _error(task(environment={"files": {"/a": {"base64": "!!"}}}))
    assert "not base64" in err.reason


def test_script_grader_and_oracle() -> None:
    loaded = ClawTask.from_json(
        task(
            grader={
                "kind": "script",
                "command": "pytest -q /verify",
                "files": {"/verify/t.py": "x"},
            },
            oracle={"kind": "script", "command": "sh /solution.sh"},
        )
    )
    assert loaded.grader.kind == "script" and loaded.oracle.kind == "script"


def test_save_and_load_directory_and_jsonl(tmp_path: Path) -> None:
    tasks = [ClawTask.from_json(task(id=f"t{i}")) for i in range(3)]
    written = save_tasks(tasks, tmp_path / "dir")
    assert sorted(p.name for p in written) == ["t0.json", "t1.json", "t2.json"]
    assert load_tasks(tmp_path / "dir") == tasks
    save_tasks(tasks, tmp_path / "all.jsonl")
    assert load_tasks(tmp_path / "all.jsonl") == tasks
    (tmp_path / "arr.json").write_text(json.dumps([t.to_json() for t in tasks]))
    assert load_tasks(tmp_path / "arr.json") == tasks


def test_load_names_the_file_line_and_duplicates(tmp_path: Path) -> None:
    lines = [json.dumps(task(id="a")), json.dumps(task(id="b", services=["fax"]))]

    (tmp_path / "x.jsonl").write_text("\n".join(lines) + "\n")
    with pytest.raises(TaskFormatError) as info:
        load_tasks(tmp_path / "x.jsonl")
    assert info.value.source == f"{tmp_path / 'x.jsonl'}:2" and info.value.task == "b"
    (tmp_path / "one.json").write_text(json.dumps(task(id="a")))
    (tmp_path / "two.json").write_text(json.dumps(task(id="a")))
    with pytest.raises(TaskFormatError, match="already in"):
        load_tasks(tmp_path / "one.json", tmp_path / "two.json")
    with pytest.raises(TaskFormatError, match="no such file"):
        load_tasks(tmp_path / "missing")
    (tmp_path / "empty").mkdir()
    with pytest.raises(TaskFormatError, match=r"no \.json"):
        load_tasks(tmp_path / "empty")
    with pytest.raises(ValueError, match="repeat"):
        save_tasks([ClawTask.from_json(REPLY)] * 2, tmp_path / "dupes")


def test_services_default_to_the_offered_ones() -> None:
    obj = task()
    del obj["services"]
    loaded = ClawTask.from_json(obj)
    assert loaded.services == ["mail", "calendar"] == loaded.offered_services
    assert ClawTask.from_json(task(fixtures=None, services=[])).offered_services == []


def test_schema_names_every_check_kind() -> None:
    text = json.dumps(task_json_schema())
    for kind in ("state", "audit", "answer", "all_of", "any_of", "only_services", "tool_calls"):
        assert f'"{kind}"' in text
