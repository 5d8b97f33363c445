"""The browser agent's action space as tool calls: schemas, one frozen dataclass per action,
and :func:`parse_action`, the only way a model's output becomes an action.

Coordinates are normalised to the viewport (``0.0 .. 1.0``, ``(0, 0)`` the top-left corner),
so the same action means the same place whatever the screenshot's pixel size or the
device scale factor; the in-sandbox server multiplies by the viewport's CSS size.

Every model output is hostile: :func:`parse_action` accepts a tool name and its arguments
(a JSON string as OpenAI-style APIs send them, or an already decoded mapping) and either
returns a valid :data:`Action` or raises :class:`BadAction` with a reason a model can be
shown. Unknown tools, unknown or missing arguments, wrong types (``bool`` is not a number),
NaN/inf, coordinates out of range, over-long text and unknown scroll directions are all
refused; nothing is clamped, coerced or dropped silently.

Written here rather than taken from a library: the agent frameworks that ship browser
actions (BrowserGym, Playwright MCP) bring their own runtimes and pixel coordinates; this is
a few validated dataclasses, shared verbatim by the driver and the tests.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

MAX_TEXT_CHARS = 2000
MAX_URL_CHARS = 2048
MAX_ANSWER_CHARS = 4000
MAX_WAIT_SECONDS = 10.0
MAX_SCROLL_AMOUNT = 10.0
SCROLL_DIRECTIONS = ("up", "down", "left", "right")
# Playwright key names: "Enter", "a", "ArrowDown", "Control+A", "Shift+Tab", "F5", ...
_KEY_RE = re.compile(r"^[A-Za-z0-9]+(\+[A-Za-z0-9]+)*$|^[!-~]$")
MAX_KEY_CHARS = 40
_URL_SCHEMES = ("http://", "https://", "file://", "about:")


class BadAction(ValueError):
    """A model's tool call that is not a valid action; ``reason`` says why (shown to the model)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True)
class Click:
    """A left click at ``(x, y)``, normalised to the viewport."""

    x: float
    y: float
    name = "click"


@dataclass(frozen=True)
class Type:
    """Type ``text`` with the keyboard; with ``x`` and ``y``, click there first (to focus)."""

    text: str
    x: float | None = None
    y: float | None = None
    name = "type"


@dataclass(frozen=True)
class Scroll:
    """Scroll the page by ``amount`` viewports (``0.5`` = half a screen) in ``direction``."""

    direction: str
    amount: float = 0.5
    name = "scroll"


@dataclass(frozen=True)
class Key:
    """Press a key or a chord in Playwright's notation (``Enter``, ``Tab``, ``Control+A``)."""

    key: str
    name = "key"


@dataclass(frozen=True)
class Navigate:
    """Load ``url`` (``http(s)://``, ``file://`` or ``about:``) in the current tab."""

    url: str
    name = "navigate"


@dataclass(frozen=True)
class Back:
    """The browser's back button."""

    name = "back"


@dataclass(frozen=True)
class Wait:
    """Do nothing for ``seconds`` (at most :data:`MAX_WAIT_SECONDS`), e.g. for a page to load."""

    seconds: float
    name = "wait"


@dataclass(frozen=True)
class Done:
    """The episode's end: the agent's final ``answer`` (may be empty for pure UI tasks)."""

    answer: str = ""
    name = "done"


Action = Click | Type | Scroll | Key | Navigate | Back | Wait | Done


def action_to_dict(action: Action) -> dict[str, Any]:
    """``{"name": ..., "arguments": {...}}``: the wire form the in-sandbox server takes (unset
    optional fields left out, so :func:`parse_action` reads it back to the same action)."""
    arguments = {k: v for k, v in asdict(action).items() if v is not None}
    return {"name": action.name, "arguments": arguments}


def describe_action(action: Action) -> str:
    """A short text form for action histories (the judge's, logs): ``click(x=0.25, y=0.40)``,
    ``type(text='hello')``, ``done(answer='42')``; floats to 3 decimals, text cut at 200."""
    parts = []
    for key, value in action_to_dict(action)["arguments"].items():
        if isinstance(value, float):
            parts.append(f"{key}={value:.3f}")
        elif isinstance(value, str) and len(value) > 200:
            parts.append(f"{key}={value[:200]!r}...")
        else:
            parts.append(f"{key}={value!r}")
    return f"{action.name}({', '.join(parts)})"


def _point_schema(what: str) -> dict[str, Any]:
    return {"type": "number", "minimum": 0, "maximum": 1, "description": what}


def _tool(
    name: str, description: str, props: dict[str, Any], required: list[str]
) -> dict[str, Any]:
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": description,
            "parameters": {
                "type": "object",
                "properties": props,
                "required": required,
                "additionalProperties": False,
            },
        },
    }


_X = _point_schema("horizontal position, 0 = left edge, 1 = right edge of the screenshot")
_Y = _point_schema("vertical position, 0 = top edge, 1 = bottom edge of the screenshot")

TOOLS: list[dict[str, Any]] = [
    _tool("click", "Click at a point of the screenshot.", {"x": _X, "y": _Y}, ["x", "y"]),
    _tool(
        "type",
        "Type text with the keyboard. Give x and y to click there first (to focus a field).",
        {"text": {"type": "string", "maxLength": MAX_TEXT_CHARS}, "x": _X, "y": _Y},
        ["text"],
    ),
    _tool(
        "scroll",
        "Scroll the page.",
        {
            "direction": {"type": "string", "enum": list(SCROLL_DIRECTIONS)},
            "amount": {
                "type": "number",
                "exclusiveMinimum": 0,
                "maximum": MAX_SCROLL_AMOUNT,
                "description": "how far, in screens (default 0.5)",
            },
        },
        ["direction"],
    ),
    _tool(
        "key",
        "Press a key or a key chord, e.g. Enter, Tab, Backspace, ArrowDown, Control+A.",
        {"key": {"type": "string", "maxLength": MAX_KEY_CHARS}},
        ["key"],
    ),
    _tool(
        "navigate",
        "Open a URL in the current tab.",
        {"url": {"type": "string", "maxLength": MAX_URL_CHARS}},
        ["url"],
    ),
    _tool("back", "Go back to the previous page.", {}, []),
    _tool(
        "wait",
        "Wait for the page to change.",
        {"seconds": {"type": "number", "exclusiveMinimum": 0, "maximum": MAX_WAIT_SECONDS}},
        ["seconds"],
    ),
    _tool(
        "done",
        "Finish the task, with the final answer if the task asks a question.",
        {"answer": {"type": "string", "maxLength": MAX_ANSWER_CHARS}},
        [],
    ),
]
TOOL_NAMES = tuple(t["function"]["name"] for t in TOOLS)


def _number(args: Mapping[str, Any], key: str) -> float:
    value = args[key]
    # bool is an int subclass: "x": true is a malformed call, not 1.0.
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise BadAction(f"{key} must be a number, got {type(value).__name__}")
    number = float(value)
    if not math.isfinite(number):
        raise BadAction(f"{key} must be a finite number, got {value!r}")
    return number


def _coordinate(args: Mapping[str, Any], key: str) -> float:
    number = _number(args, key)
    if not 0.0 <= number <= 1.0:
        raise BadAction(f"{key}={number} is outside the screen: coordinates are 0..1")
    return number


def _string(args: Mapping[str, Any], key: str, limit: int, *, empty: bool = True) -> str:
    value = args[key]
    if not isinstance(value, str):
        raise BadAction(f"{key} must be a string, got {type(value).__name__}")
    if len(value) > limit:
        raise BadAction(f"{key} is {len(value)} characters long; at most {limit}")
    if not empty and not value:
        raise BadAction(f"{key} must not be empty")
    if "\x00" in value:
        raise BadAction(f"{key} contains a NUL character")
    return value


def _check_keys(name: str, args: Mapping[str, Any], required: set[str], optional: set[str]) -> None:
    unknown = set(args) - required - optional
    if unknown:
        raise BadAction(f"{name}: unknown argument(s) {sorted(unknown)}")
    missing = required - set(args)
    if missing:
        raise BadAction(f"{name}: missing argument(s) {sorted(missing)}")


def _decode(arguments: str | Mapping[str, Any] | None) -> Mapping[str, Any]:
    if arguments is None:
        return {}
    if isinstance(arguments, str):
        if not arguments.strip():
            return {}
        try:
            decoded = json.loads(arguments)
        except (json.JSONDecodeError, RecursionError) as err:
            raise BadAction(f"arguments are not valid JSON: {err}") from None
    else:
        decoded = arguments
    if not isinstance(decoded, Mapping):
        raise BadAction(f"arguments must be a JSON object, got {type(decoded).__name__}")
    if not all(isinstance(k, str) for k in decoded):
        raise BadAction("argument names must be strings")
    return decoded


def parse_action(name: object, arguments: str | Mapping[str, Any] | None) -> Action:
    """The action a tool call names, validated; :class:`BadAction` for anything malformed."""
    if not isinstance(name, str):
        raise BadAction(f"tool name must be a string, got {type(name).__name__}")
    args = _decode(arguments)
    if name == "click":
        _check_keys(name, args, {"x", "y"}, set())
        return Click(_coordinate(args, "x"), _coordinate(args, "y"))
    if name == "type":
        _check_keys(name, args, {"text"}, {"x", "y"})
        if ("x" in args) != ("y" in args):
            raise BadAction("type: give both x and y, or neither")
        text = _string(args, "text", MAX_TEXT_CHARS, empty=False)
        if "x" in args:
            return Type(text, _coordinate(args, "x"), _coordinate(args, "y"))
        return Type(text)
    if name == "scroll":
        _check_keys(name, args, {"direction"}, {"amount"})
        direction = _string(args, "direction", 10)
        if direction not in SCROLL_DIRECTIONS:
            raise BadAction(f"scroll: direction must be one of {list(SCROLL_DIRECTIONS)}")
        amount = _number(args, "amount") if "amount" in args else 0.5
        if not 0.0 < amount <= MAX_SCROLL_AMOUNT:
            raise BadAction(f"scroll: amount must be in (0, {MAX_SCROLL_AMOUNT}] screens")
        return Scroll(direction, amount)
    if name == "key":
        _check_keys(name, args, {"key"}, set())
        key = _string(args, "key", MAX_KEY_CHARS, empty=False)
        if not _KEY_RE.match(key):
            raise BadAction(f"key: {key!r} is not a key name (e.g. Enter, Tab, Control+A)")
        return Key(key)
    if name == "navigate":
        _check_keys(name, args, {"url"}, set())
        url = _string(args, "url", MAX_URL_CHARS, empty=False)
        if not url.startswith(_URL_SCHEMES) or any(c.isspace() for c in url):
            raise BadAction("navigate: url must start with http://, https://, file:// or about:")
        return Navigate(url)
    if name == "back":
        _check_keys(name, args, set(), set())
        return Back()
    if name == "wait":
        _check_keys(name, args, {"seconds"}, set())
        seconds = _number(args, "seconds")
        if not 0.0 < seconds <= MAX_WAIT_SECONDS:
            raise BadAction(f"wait: seconds must be in (0, {MAX_WAIT_SECONDS}]")
        return Wait(seconds)
    if name == "done":
        _check_keys(name, args, set(), {"answer"})
        return Done(_string(args, "answer", MAX_ANSWER_CHARS) if "answer" in args else "")
    raise BadAction(f"unknown tool {name[:60]!r}; the tools are {list(TOOL_NAMES)}")
