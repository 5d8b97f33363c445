"""The generator's pure parts: reading hostile replies, checking ideas, the acceptance rule,
counting the proxy's records, splitting and summing costs, and the prompts the docs quote."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from orchard.recipes.claw.generator import prompts
from orchard.recipes.claw.generator.acceptance import judge
from orchard.recipes.claw.generator.backend import Trial
from orchard.recipes.claw.generator.costs import TaskCost, shares, summarise
from orchard.recipes.claw.generator.ideas import read_ideas
from orchard.recipes.claw.generator.loop import GeneratorOptions
from orchard.recipes.claw.generator.model import Usage, usage_of_records
from orchard.recipes.claw.generator.replies import MAX_DEPTH, MalformedReply, json_object

from .deadline import run_python

DOCS = Path(__file__).resolve().parents[3] / "docs" / "recipes" / "claw-generator.md"


# --- replies ---------------------------------------------------------------------------------


def test_a_reply_is_one_object_or_one_fenced_object() -> None:
    assert json_object('{"a": 1}') == {"a": 1}
    assert json_object('Here it is:\n```json\n{"a": [1, 2]}\n```\nDone.') == {"a": [1, 2]}
    assert json_object('  \n{"a": {"b": null}}\n') == {"a": {"b": None}}


@pytest.mark.parametrize(
    ("reply", "why"),
    [
        ("", "empty"),
        (None, "empty"),
        ("no json here", "0 fenced blocks"),
        ('```json\n{"a": 1}\n```\n```json\n{"b": 2}\n```', "2 fenced blocks"),
        ('{"a": 1', "does not parse"),
        ("[1, 2, 3]", "0 fenced blocks"),
        ("```json\n[1, 2]\n```", "a list, not an object"),
        ('{"a": 1} {"b": 2}', "does not parse"),
        ('{"a": NaN}', None),
    ],
)
def test_a_malformed_reply_says_what_is_wrong(reply: object, why: str | None) -> None:
    if why is None:  # NaN is JSON-ish but Python's parser takes it: still an object
        assert json_object(reply) == {"a": pytest.approx(float("nan"), nan_ok=True)}
        return
    with pytest.raises(MalformedReply, match=re.escape(why)):
        json_object(reply)


def test_huge_and_deep_replies_are_refused_before_they_cost() -> None:
    with pytest.raises(MalformedReply, match="over the 100 allowed"):
        json_object('{"a": "' + "x" * 200 + '"}', max_chars=100)
    deep = '{"a": ' * (MAX_DEPTH + 1) + "1" + "}" * (MAX_DEPTH + 1)
    with pytest.raises(MalformedReply, match="nested deeper"):
        json_object(deep)
    very_deep = '{"a": ' * 100_000 + "1" + "}" * 100_000
    with pytest.raises(MalformedReply):
        json_object(very_deep, max_chars=10**7)


# --- ideas -----------------------------------------------------------------------------------

SERVICES = ("mail", "calendar", "contacts", "files", "todo", "search")


def _idea(i: str, **extra: object) -> dict[str, object]:
    return {"id": i, "title": f"title {i}", "summary": f"summary {i}", "services": ["mail"],
            **extra}  # fmt: skip


def test_ideas_are_taken_or_rejected_each_with_a_reason() -> None:
    reply = {
        "ideas": [
            _idea("reply-to-boss"),
            _idea("existing-task"),
            _idea("reply-to-boss"),
            _idea("Bad Id!"),
            _idea("uses-a-spaceship", services=["spaceship"]),
            _idea("wrong-category", category="travel"),
            _idea("extra-field", url="http://x"),
            "not an object",
            _idea("second-good"),
            _idea("third-good"),
        ]
    }
    taken, rejected = read_ideas(reply, category="email", services=SERVICES,
                                 existing={"existing-task"}, limit=2)  # fmt: skip
    assert [i.id for i in taken] == ["reply-to-boss", "second-good"]
    assert all(i.category == "email" for i in taken)
    codes = [(r.id, r.code) for r in rejected]
    assert codes == [
        ("existing-task", "duplicate"),
        ("reply-to-boss", "duplicate"),
        ("Bad Id!", "invalid_idea"),
        ("uses-a-spaceship", "invalid_idea"),
        ("wrong-category", "invalid_idea"),
        ("extra-field", "invalid_idea"),
        ("#7", "invalid_idea"),
        ("third-good", "over_limit"),
    ]
    assert "existing task" in rejected[0].reason and "proposed twice" in rejected[1].reason
    assert "spaceship" in rejected[3].reason and "unknown fields" in rejected[5].reason


def test_a_reply_that_is_not_the_ideas_shape_is_malformed() -> None:
    for reply in ({"ideas": "many"}, {"tasks": []}, {"ideas": [], "more": 1},
                  {"ideas": [_idea(f"i-{n:03}") for n in range(51)]}):  # fmt: skip
        with pytest.raises(MalformedReply):
            read_ideas(reply, category="c", services=SERVICES, existing=(), limit=3)


def test_idea_text_is_bounded() -> None:
    _, rejected = read_ideas({"ideas": [_idea("long-one", summary="x" * 5000)]},
                             category="c", services=SERVICES, existing=(), limit=3)  # fmt: skip
    assert rejected[0].code == "invalid_idea" and "over 2000" in rejected[0].reason


# --- acceptance ------------------------------------------------------------------------------


def _trial(kind: str, score: float | None, **kw: object) -> Trial:
    return Trial(kind, score, score is not None and score >= 0.75, **kw)  # type: ignore[arg-type]


def test_kept_only_when_the_oracle_passes_and_the_null_run_fails() -> None:
    assert judge(_trial("oracle", 1.0), _trial("null", 0.0), 0.75).kept
    assert judge(_trial("oracle", 0.75), _trial("null", 0.5), 0.75).kept
    lax = judge(_trial("oracle", 1.0), _trial("null", 0.8, components={"sent": 1.0}), 0.75)
    assert (lax.kept, lax.reason, lax.revisable) == (False, "null_passed", True)
    assert "too lax" in lax.feedback and "sent=1" in lax.feedback
    strict = judge(_trial("oracle", 0.5, safety=["deleted mail"]), _trial("null", 0.0), 0.75)
    assert (strict.reason, strict.revisable) == ("oracle_failed", True)
    assert "deleted mail" in strict.feedback
    both = judge(_trial("oracle", 0.2), _trial("null", 0.9), 0.75)
    assert both.reason == "oracle_failed" and "too lax" in both.feedback


def test_faults_are_the_tasks_or_the_infrastructures() -> None:
    broken = _trial("oracle", None, fault="setup: 'false' exited 1", fault_is_task=True)
    verdict = judge(broken, _trial("null", 0.0), 0.75)
    assert (verdict.reason, verdict.revisable) == ("task_fault", True)
    assert "exited 1" in verdict.feedback
    lost = _trial("null", None, fault="sandbox: create: quota", fault_is_task=False)
    verdict = judge(_trial("oracle", 1.0), lost, 0.75)
    assert (verdict.kept, verdict.reason, verdict.revisable) == (False, "infrastructure", False)
    assert judge(_trial("oracle", None), _trial("null", 0.0), 0.75).reason == "infrastructure"


# --- usage and costs -------------------------------------------------------------------------


def test_usage_is_read_from_the_proxys_records() -> None:
    records = [
        {"response": {"usage": {"prompt_tokens": 100, "completion_tokens": 20}}, "total_ms": 500},
        {"response": {"choices": []}, "prompt_token_ids": [1, 2, 3],
         "completion_token_ids": [4, 5], "total_ms": 250},
        {"response": None, "status": 502, "total_ms": "x"},
        {"response": {"usage": {"prompt_tokens": -5, "completion_tokens": True}}},
    ]  # fmt: skip
    usage = usage_of_records(records)
    assert usage.as_dict() == {"calls": 4, "prompt_tokens": 103, "completion_tokens": 22,
                               "seconds": 0.75}  # fmt: skip


def test_a_proposal_is_shared_and_a_run_summed() -> None:
    parts = shares(Usage(1, 10, 5, 3.0), 3)
    assert [(p.calls, p.prompt_tokens, p.completion_tokens) for p in parts] == [
        (1, 4, 2), (0, 3, 2), (0, 3, 1),
    ]  # fmt: skip
    assert sum(p.seconds for p in parts) == pytest.approx(3.0)
    assert shares(Usage(1, 1, 1, 1.0), 0) == []
    kept, dropped = TaskCost(), TaskCost()
    kept.add("build", Usage(2, 100, 50, 1.0))
    kept.add("solve", Usage(3, 300, 30, 2.0))
    kept.sandbox_seconds, kept.wall_seconds = 4.0, 10.0
    dropped.add("revise", Usage(1, 40, 10, 0.5))
    dropped.sandbox_seconds, dropped.wall_seconds = 2.0, 5.0
    summary = summarise([(True, kept), (False, dropped)], {"propose": Usage(1, 10, 10, 0.1)})
    assert summary["spent"]["model_calls"] == 7
    assert summary["spent"]["prompt_tokens"] == 450
    assert summary["spent"]["stages"]["revise"]["calls"] == 1
    assert summary["kept_tasks_own"]["prompt_tokens"] == 400
    assert summary["per_kept_task"] == {"model_calls": 7.0, "prompt_tokens": 450.0,
                                        "completion_tokens": 100.0, "sandbox_seconds": 6.0,
                                        "wall_seconds": 15.0}  # fmt: skip
    assert summarise([(False, dropped)], {})["per_kept_task"] is None


def test_options_are_checked() -> None:
    with pytest.raises(ValueError, match="ideas"):
        GeneratorOptions(category="c", ideas=0)
    with pytest.raises(ValueError, match="revise_rounds"):
        GeneratorOptions(category="c", revise_rounds=-1)


# --- prompts ---------------------------------------------------------------------------------


def test_the_docs_quote_every_prompt_verbatim() -> None:
    text = DOCS.read_text()
    for name, prompt in prompts.ALL.items():
        assert f'```text title="{name}"\n{prompt}\n```' in text, name


def test_the_templates_take_exactly_their_fields() -> None:
    fields = {
        "PROPOSE_TEMPLATE": {"count", "category", "capabilities", "existing"},
        "BUILD_SYSTEM": {"format_reference"},
        "BUILD_TEMPLATE": {"id", "category", "idea"},
        "REPAIR_TEMPLATE": {"error"},
        "REVISE_TEMPLATE": {"feedback", "idea", "task", "id", "category"},
    }
    import string

    for name, prompt in prompts.ALL.items():
        used = {f for _, f, _, _ in string.Formatter().parse(prompt) if f}
        assert used == fields.get(name, set()), name
    # the JSON shape the propose prompt shows is JSON once formatted
    shown = prompts.PROPOSE_TEMPLATE.format(count=3, category="c", capabilities="", existing="")
    shape = shown.split("exactly this JSON shape:\n", 1)[1].split("\nIds are", 1)[0]
    assert set(json.loads(shape)) == {"ideas"}


# --- the recipe's format, held to the generator's policy --------------------------------------


def _example(**changes: object) -> dict[str, object]:
    import copy

    from orchard.recipes.claw.generator.taskformat import EXAMPLE

    out = copy.deepcopy(EXAMPLE)
    out.update(changes)
    return out


def test_the_worked_example_is_a_valid_task_and_round_trips() -> None:
    from orchard.recipes.claw.generator.taskformat import ClawFormat

    fmt = ClawFormat()
    task = fmt.parse(_example())
    assert fmt.parse(fmt.to_json(task)) == task
    reference = fmt.format_reference()
    assert '"reply-budget"' in reference and "mail_send" in reference
    assert all(f"- {name}: tools" in fmt.capabilities() for name in fmt.services())


@pytest.mark.parametrize(
    ("changes", "why"),
    [
        ({"environment": {"image": "evil:latest"}}, "environment.image"),
        ({"services": ["mail", "spaceship"]}, "services"),
        ({"grader": {"kind": "checks", "components": []}}, "grader"),
        ({"fixtures": {"mail": {"messages": [{"id": "m1"}]}}}, "fixtures.mail.messages.0"),
        ({"fixtures": {"mail": {"inbox": []}}}, "fixtures.mail.inbox"),
        ({"prompt": "x" * 300_000}, "over 262144"),
    ],
)
def test_an_invalid_generated_task_names_what_to_fix(changes: dict[str, object], why: str) -> None:
    from orchard.recipes.claw.generator.backend import InvalidTask
    from orchard.recipes.claw.generator.taskformat import ClawFormat

    with pytest.raises(InvalidTask, match=re.escape(why)):
        ClawFormat().parse(_example(**changes))


@pytest.mark.parametrize(
    ("pattern", "why"),
    [("^re:", None), ("(a+)+$", None), ("(x*)*", None), ("(a|aa)+", None), ("(ab|cd)+", None),
     ("a{1,3}b", None), ("x" * 200, None), ("x" * 201, "201 characters, over 200"),
     (r"(a)\1", "no backreferences"), ("fine(?=ly)", "invalid perl operator: (?="),
     ("(?<!not )fine", "invalid perl operator: (?<!"), (".{300}", "RE2 instructions")],
)  # fmt: skip
def test_generated_regexes_are_held_to_re2_and_a_length(pattern: str, why: str | None) -> None:
    """Nested quantifiers are accepted (RE2 runs them in linear time: the attack below); what
    RE2 cannot run, compiles too large, or is over the generator's length is refused, naming
    the field."""
    from orchard.recipes.claw.generator.backend import InvalidTask
    from orchard.recipes.claw.generator.taskformat import ClawFormat

    task = _example()
    task["grader"]["components"][0]["checks"][0]["where"]["arguments.to"] = {"regex": pattern}  # type: ignore[index]
    if why is None:
        ClawFormat().parse(task)
        return
    with pytest.raises(InvalidTask, match=re.escape(why)) as info:
        ClawFormat().parse(task)
    assert "where.arguments.to.regex: " in str(info.value)


GRADE_A_GENERATED_TASK = """
import json, sys
from orchard.recipes.claw.generator.taskformat import ClawFormat
from orchard.recipes.claw.grading import grade

task = ClawFormat().parse(json.loads(sys.argv[1]))  # the generator's policy and the format
print(json.dumps(grade(task, [], {}, sys.argv[2]).to_json()))
"""


@pytest.mark.parametrize("pattern", ["((a)|(a))*b", "a*a*a*a*a*a*b", "((a|aa))+$"])
def test_a_generated_regex_cannot_freeze_the_grader(pattern: str) -> None:
    """Patterns a model may write that no nesting heuristic sees (a group in a group; no group
    at all: polynomial backtracking), graded against the agent's answer in a child process
    killed at the deadline."""
    task = _example()
    task["grader"]["components"][1]["checks"] = [  # type: ignore[index]
        {"kind": "answer", "match": {"contains": "a"}},
        {"kind": "answer", "match": {"regex": pattern}},
    ]
    hostile = "a" * 5000  # the agent's final answer: no b, no run the pattern can end on
    out = run_python(
        GRADE_A_GENERATED_TASK, json.dumps(task), hostile + ("!" if "$" in pattern else "")
    )
    told = json.loads(out)["components"][1]
    assert told["name"] == "told the user" and told["score"] == 0.5  # contains yes, regex no


# --- the command's usage errors (before any stack is asked) -----------------------------------


def test_the_command_refuses_bad_options_before_it_starts(tmp_path: Path) -> None:
    from orchard.recipes.claw.generator import cli

    base = ["--out", str(tmp_path / "out"), "--category", "mail", "--model", "m"]
    with pytest.raises(SystemExit, match="ideas must be at least 1"):
        cli.main([*base, "--ideas", "0"])
    with pytest.raises(SystemExit, match="no such file or directory"):
        cli.main([*base, "--existing", str(tmp_path / "nowhere")])
    bad = tmp_path / "bad.json"
    bad.write_text('{"id": "x"}')
    with pytest.raises(SystemExit, match=r"--existing: .*task x"):
        cli.main([*base, "--existing", str(bad)])


def test_the_tool_names_the_prompts_give_are_the_services_own() -> None:
    """The propose and build prompts name each service's tools from a table; the services
    define them in their in-sandbox code (read here as text: instantiating a service on the
    driver would touch the driver's files)."""
    from orchard.recipes.claw.generator.taskformat import TOOLS
    from orchard.recipes.claw.services import box

    source = "".join(p.read_text() for p in Path(box.__file__).parent.glob("*.py"))
    defined = set(re.findall(r'Tool\("([a-z0-9_]+)"', source))
    listed = {f"{service}_{op}" for service, ops in TOOLS.items() for op in ops}
    assert listed == defined


def test_a_failing_model_endpoint_is_a_model_error_not_an_answer() -> None:
    """``complete`` against a real (scripted) Chat server, the session's URL pointing at it."""
    import asyncio

    from orchard.recipes.claw.generator.model import GenerationModel, GenerationModelError

    from orchard.rollouts import ProxySession
    from orchard.rollouts.proxy import SessionInfo
    from orchard.testing.scripted_model import scripted_upstream

    script = [{"content": '{"ideas": []}'}, {"status": 500, "content": "overloaded"}]
    with scripted_upstream(script) as (server, url):
        info = SessionInfo("s1", "t", "", {}, 0.0, 0.0, None, "", "")
        session = ProxySession(info, "cred", url, url)

        async def main() -> tuple[str, str]:
            model = GenerationModel(None, "m", system_prompts={})  # type: ignore[arg-type]
            try:
                first = await model.complete(session, [{"role": "user", "content": "hi"}])
                with pytest.raises(GenerationModelError) as err:
                    await model.complete(session, [{"role": "user", "content": "again"}])
                return first, str(err.value)
            finally:
                await model.aclose()

        first, error = asyncio.run(main())
    assert first == '{"ideas": []}'
    assert "model answered 500" in error and "overloaded" in error
    assert [r["model"] for r in server.requests] == ["m", "m"]
