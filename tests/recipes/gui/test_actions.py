"""The action space: every tool parses to its dataclass, and hostile tool calls are refused
with a reason (never clamped, coerced or crashed on)."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest
from orchard.recipes.gui.actions import (
    MAX_TEXT_CHARS,
    TOOL_NAMES,
    TOOLS,
    Back,
    BadAction,
    Click,
    Done,
    Key,
    Navigate,
    Scroll,
    Type,
    Wait,
    action_to_dict,
    parse_action,
)


@pytest.mark.parametrize(
    ("name", "arguments", "expected"),
    [
        ("click", '{"x": 0.25, "y": 1}', Click(0.25, 1.0)),
        ("click", {"x": 0, "y": 0}, Click(0.0, 0.0)),
        ("type", '{"text": "hello"}', Type("hello")),
        ("type", '{"text": "hi", "x": 0.5, "y": 0.5}', Type("hi", 0.5, 0.5)),
        ("scroll", '{"direction": "down"}', Scroll("down", 0.5)),
        ("scroll", '{"direction": "left", "amount": 2}', Scroll("left", 2.0)),
        ("key", '{"key": "Enter"}', Key("Enter")),
        ("key", '{"key": "Control+A"}', Key("Control+A")),
        ("key", '{"key": "/"}', Key("/")),
        (
            "navigate",
            '{"url": "http://127.0.0.1:8000/a?b=1"}',
            Navigate("http://127.0.0.1:8000/a?b=1"),
        ),
        ("back", "{}", Back()),
        ("back", "", Back()),
        ("back", None, Back()),
        ("wait", '{"seconds": 1.5}', Wait(1.5)),
        ("done", '{"answer": "42"}', Done("42")),
        ("done", "{}", Done("")),
    ],
)
def test_valid_calls_parse(name: str, arguments: Any, expected: object) -> None:
    action = parse_action(name, arguments)
    assert action == expected
    # the wire form carries the same fields back
    wire = action_to_dict(action)
    assert wire["name"] == name
    assert parse_action(wire["name"], json.dumps(wire["arguments"])) == expected


@pytest.mark.parametrize(
    ("name", "arguments", "why"),
    [
        ("klick", '{"x": 0.5, "y": 0.5}', "unknown tool"),
        (None, "{}", "tool name must be a string"),
        ("click", '{"x": 0.5, "y": 0.5', "not valid JSON"),
        ("click", "[0.5, 0.5]", "must be a JSON object"),
        ("click", '{"x": 1.5, "y": 0.5}', "outside the screen"),
        ("click", '{"x": -0.01, "y": 0.5}', "outside the screen"),
        ("click", '{"x": "0.5", "y": 0.5}', "must be a number"),
        ("click", '{"x": true, "y": 0.5}', "must be a number"),
        ("click", '{"x": NaN, "y": 0.5}', "finite"),
        ("click", '{"x": Infinity, "y": 0.5}', "finite"),
        ("click", '{"x": 0.5}', "missing argument"),
        ("click", '{"x": 0.5, "y": 0.5, "button": "right"}', "unknown argument"),
        ("type", '{"text": ""}', "must not be empty"),
        ("type", '{"text": 5}', "must be a string"),
        ("type", '{"text": "a", "x": 0.5}', "both x and y"),
        ("type", json.dumps({"text": "a" * (MAX_TEXT_CHARS + 1)}), "characters long"),
        ("type", '{"text": "a\\u0000b"}', "NUL"),
        ("scroll", '{"direction": "sideways"}', "direction must be one of"),
        ("scroll", '{"direction": "down", "amount": 0}', "amount must be in"),
        ("scroll", '{"direction": "down", "amount": 100}', "amount must be in"),
        ("key", '{"key": "Enter; rm -rf /"}', "not a key name"),
        ("key", '{"key": ""}', "must not be empty"),
        ("navigate", '{"url": "javascript:alert(1)"}', "url must start with"),
        ("navigate", '{"url": "http://a b"}', "url must start with"),
        ("back", '{"steps": 2}', "unknown argument"),
        ("wait", '{"seconds": 3600}', "seconds must be in"),
        ("wait", '{"seconds": 0}', "seconds must be in"),
        ("done", '{"answer": ["a"]}', "must be a string"),
    ],
)
def test_malformed_calls_are_refused_with_a_reason(name: Any, arguments: str, why: str) -> None:
    with pytest.raises(BadAction) as caught:
        parse_action(name, arguments)
    assert why in caught.value.reason
    assert str(caught.value) == caught.value.reason


def test_deeply_nested_json_is_a_bad_action_not_a_crash() -> None:
    with pytest.raises(BadAction):
        parse_action("click", "[" * 100_000 + "]" * 100_000)


def test_the_schemas_name_every_tool_and_match_the_parser() -> None:
    assert TOOL_NAMES == ("click", "type", "scroll", "key", "navigate", "back", "wait", "done")
    for tool in TOOLS:
        assert tool["type"] == "function"
        params = tool["function"]["parameters"]
        assert params["additionalProperties"] is False
        assert set(params["required"]) <= set(params["properties"])
    click = next(t for t in TOOLS if t["function"]["name"] == "click")["function"]["parameters"]
    assert click["properties"]["x"]["minimum"] == 0 and click["properties"]["x"]["maximum"] == 1
    # the schema's bounds are the parser's bounds
    assert parse_action("click", {"x": 1, "y": 1}) == Click(1.0, 1.0)
    assert not math.isnan(parse_action("wait", {"seconds": 10}).seconds)  # type: ignore[union-attr]
