"""Scripted stand-ins for a vision-language model and for the judge (no such model runs here).

:class:`VlmPolicy` is the policy callable of ``orchard.testing.scripted_model`` behind the
recording proxy. It reads what the agent sends, as a model would read the text part of its
observations: the task line (``Task: <MiniWoB utterance>``) and the first observation's
element list (``[i] tag "text" box=x0,y0,x1,y1``), plans the clicks and typing from them, and
answers turn by turn (the number of assistant turns in the history is the step). Its mode is
the request's model name (the CLI's ``--model``):

- ``good``: solves click-button, click-link, enter-text, click-checkboxes and focus-text;
- ``wrong``: clicks a button that is not the one asked for, and says so (an honest failure);
- ``liar``: clicks a wrong button but *claims* the right one (a judge reading only the
  reasoning is fooled: the agreement report must show it);
- ``mute``: replies with text and no tool call (malformed), every turn;
- ``crash``: as ``good``, but before answering its first turn it kills the sandbox's Chromium
  (through the SDK, :attr:`VlmPolicy.kill`): the agent's next step meets a dead browser.

:func:`judge_policy` is a deliberately simple judge: it checks it was shown the screenshots
(PNG data URLs, at most three), then says SUCCESS when every target the task names (quoted
words; the names after "Select") appears in the reasoning of the agent's last step. It
trusts the agent's words, so it is right on honest agents and wrong on the liar: the kind
of judge error the agreement check exists to catch. For focus-text it answers 500 every
time (a judge outage: that sample must be dropped).
"""

from __future__ import annotations

import base64
import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

ELEMENT = re.compile(
    r'^\[(\d+)\] (\S+) ("(?:[^"\\]|\\.)*") box=([\d.]+),([\d.]+),([\d.]+),([\d.]+)'
)


@dataclass(frozen=True)
class Element:
    tag: str
    text: str
    box: tuple[float, float, float, float]

    @property
    def center(self) -> tuple[float, float]:
        x0, y0, x1, y1 = self.box
        return round((x0 + x1) / 2, 4), round((y0 + y1) / 2, 4)


def elements_of(text: str) -> list[Element]:
    out = []
    for line in text.splitlines():
        m = ELEMENT.match(line)
        if m:
            box = tuple(float(m.group(i)) for i in range(4, 8))
            out.append(Element(m.group(2), json.loads(m.group(3)), box))  # type: ignore[arg-type]
    return out


def _texts(message: dict[str, Any]) -> str:
    content = message.get("content")
    if isinstance(content, list):
        return "\n".join(str(p.get("text", "")) for p in content if p.get("type") == "text")
    return str(content or "")


def _call(name: str, args: dict[str, Any], step: int, reasoning: str) -> dict[str, Any]:
    return {"content": reasoning,
            "tool_calls": [{"id": f"call{step}", "name": name, "arguments": json.dumps(args)}]}  # fmt: skip


def _find(elements: list[Element], text: str, tags: tuple[str, ...] = ()) -> Element:
    hits = [e for e in elements if e.text.strip() == text and (not tags or e.tag in tags)]
    if not hits:
        raise LookupError(f"no element {text!r} in {[(e.tag, e.text) for e in elements]}")
    return min(hits, key=lambda e: (e.box[2] - e.box[0]) * (e.box[3] - e.box[1]))


def plan(task: str, elements: list[Element], mode: str) -> list[tuple[str, dict[str, Any], str]]:
    """(tool, arguments, reasoning) per step for the task ``task`` on the first page."""
    quoted = re.findall(r'"([^"]*)"', task)
    if mode in ("wrong", "liar"):
        target = quoted[0] if quoted else ""
        other = next(e for e in elements if e.tag == "button" and e.text.strip() != target)
        x, y = other.center
        said = target if mode == "liar" else other.text.strip()
        return [("click", {"x": x, "y": y}, f'I click the "{said}" button.')]
    if task.startswith("Click on the") and "button" in task:
        x, y = _find(elements, quoted[0], ("button",)).center
        return [("click", {"x": x, "y": y}, f'The "{quoted[0]}" button is there; I click it.')]
    if "link" in task:
        x, y = _find(elements, quoted[0]).center
        return [("click", {"x": x, "y": y}, f'I click the link "{quoted[0]}".')]
    if task.startswith("Enter"):
        field = next(e for e in elements if e.tag in ("input", "textarea"))
        fx, fy = field.center
        sx, sy = _find(elements, "Submit", ("button",)).center
        return [
            (
                "type",
                {"text": quoted[0], "x": fx, "y": fy},
                f'I type "{quoted[0]}" into the field.',
            ),
            ("click", {"x": sx, "y": sy}, f'"{quoted[0]}" is typed; I press Submit.'),
        ]
    if task.startswith("Select"):
        names = _select_names(task)
        steps = []
        for name in names:
            x, y = _find(elements, name, ("input", "label")).center
            steps.append(("click", {"x": x, "y": y}, f"I tick {name}."))
        sx, sy = _find(elements, "Submit", ("button",)).center
        steps.append(
            ("click", {"x": sx, "y": sy}, f"{', '.join(names) or 'Nothing'} ticked; Submit.")
        )
        return steps
    if task.startswith("Focus"):
        field = next(e for e in elements if e.tag in ("input", "textarea"))
        x, y = field.center
        return [("click", {"x": x, "y": y}, "I click into the textbox to focus it.")]
    raise LookupError(f"no plan for {task!r}")


def _select_names(task: str) -> list[str]:
    listed = task.removeprefix("Select ").split(" and click Submit")[0]
    if listed.strip().lower() == "nothing":
        return []
    return [n.strip() for n in listed.replace(" and ", ",").split(",") if n.strip()]


CRASH = ["pkill", "-9", "-f", "/usr/lib/chromium/chromium"]
"""Kill Chromium in the sandbox it runs in (its own pid space), as gui-env's browser tests do."""


class VlmPolicy:
    def __init__(self) -> None:
        self.seen_images: list[int] = []
        self.kill: Callable[[], None] | None = None
        """Set by the test once the stack is up: kills the running rollout's browser."""

    def __call__(self, body: dict[str, Any]) -> dict[str, Any]:
        messages = body["messages"]
        step = sum(1 for m in messages if m["role"] == "assistant")
        images = sum(
            1 for m in messages if isinstance(m.get("content"), list)
            for p in m["content"] if p.get("type") == "image_url"
        )  # fmt: skip
        self.seen_images.append(images)
        mode = body.get("model", "good")
        if mode == "crash" and step == 0:
            assert self.kill is not None
            self.kill()
            mode = "good"
        if mode == "mute":
            return {"content": "I am not sure what to do."}
        task = next(_texts(m) for m in messages if _texts(m).startswith("Task: ")).removeprefix(
            "Task: "
        )
        first = next(m for m in messages if isinstance(m.get("content"), list))
        steps = plan(task, elements_of(_texts(first)), mode)
        if step >= len(steps):
            return _call("done", {}, step, "Everything the task asked is done.")
        name, args, reasoning = steps[step]
        return _call(name, args, step, reasoning)


def judge_policy(body: dict[str, Any]) -> dict[str, Any]:
    parts = body["messages"][1]["content"]
    text = parts[0]["text"]
    task = text.split("Task:\n", 1)[1].split("\n\nActions:", 1)[0]
    if task.startswith("Focus"):
        return {"status": 500, "content": "judge overloaded"}
    images = [p["image_url"]["url"] for p in parts if p["type"] == "image_url"]
    assert 1 <= len(images) <= 3, len(images)
    for url in images:
        assert url.startswith("data:image/png;base64,")
        assert base64.b64decode(url.split(",", 1)[1]).startswith(b"\x89PNG\r\n\x1a\n")
    targets = re.findall(r'"([^"]*)"', task) or _select_names(task)
    steps = re.findall(r"^\d+\. (.*)$", text.split("\n\nActions:\n", 1)[1], re.M)
    last = steps[-1] if steps else ""
    ok = bool(steps) and all(t in last for t in targets)
    return {"content": json.dumps({"reasoning": f"last step: {last[:100]}",
                                   "verdict": "SUCCESS" if ok else "FAILURE"})}  # fmt: skip
