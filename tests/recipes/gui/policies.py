"""Scripted MiniWoB policies over ``Observation.elements`` (the stand-in for a vision model).

Each reads the task's instruction and the first observation's elements (text and
normalised boxes) and returns the tool calls a careful agent would make, as
``(name, arguments)`` pairs that go through :func:`parse_action` like a model's output.
``wrong_*`` policies do something plausible but wrong, so the task's own signal must say
failure.
"""

from __future__ import annotations

import re
from typing import Any

from orchard.recipes.gui.browser import Element, Observation

Call = tuple[str, dict[str, Any]]


def quoted(utterance: str) -> str:
    """The text between the first pair of double quotes of an instruction."""
    found = re.search(r'"([^"]+)"', utterance)
    if found is None:
        raise AssertionError(f"no quoted target in {utterance!r}")
    return found.group(1)


def click(element: Element) -> Call:
    x, y = element.center
    return ("click", {"x": x, "y": y})


def by_id(obs: Observation, element_id: str) -> Element:
    for element in obs.elements:
        if element.id == element_id:
            return element
    raise AssertionError(f"no element #{element_id} in {[e.id for e in obs.elements]}")


def checkbox_targets(utterance: str) -> list[str]:
    """``Select a, b and click Submit.`` -> ``["a", "b"]`` (``nothing`` -> ``[]``)."""
    found = re.fullmatch(r"Select (.*) and click Submit\.", utterance)
    if found is None:
        raise AssertionError(f"not a click-checkboxes instruction: {utterance!r}")
    names = found.group(1)
    return [] if names == "nothing" else names.split(", ")


def solve(task: str, obs: Observation) -> list[Call]:
    """The calls that solve ``task`` from its first observation."""
    if task == "click-button":
        return [click(obs.find(quoted(obs.utterance), tag="button"))]
    if task == "click-link":
        return [click(obs.find(quoted(obs.utterance), tag="span"))]
    if task == "click-checkboxes":
        boxes = [e for e in obs.elements if e.tag == "input" and e.type == "checkbox"]
        calls = [click(b) for b in boxes if b.text in checkbox_targets(obs.utterance)]
        return [*calls, click(by_id(obs, "subbtn"))]
    if task == "enter-text":
        x, y = by_id(obs, "tt").center
        return [("type", {"text": quoted(obs.utterance), "x": x, "y": y}),
                click(by_id(obs, "subbtn"))]  # fmt: skip
    if task == "focus-text":
        return [click(by_id(obs, "tt"))]
    raise AssertionError(f"no scripted policy for {task}")


def wrong_button(obs: Observation) -> Call | None:
    """click-button: a button that is NOT the one asked for (None if there is none)."""
    target = quoted(obs.utterance)
    others = [e for e in obs.elements if e.tag == "button" and e.text != target]
    return click(others[0]) if others else None
