"""The agent's message assembly without a browser: the last k screenshots as images, older
ones as placeholders, the observation text, the transcript without image bytes, the task
metadata it needs. (The loop itself runs against real browsers in test_gui_live.py.)"""

from __future__ import annotations

import pytest
from orchard.recipes.gui.agent import (
    GuiAgent,
    GuiAgentConfig,
    _Episode,
    env_task_of,
    observation_text,
)
from orchard.recipes.gui.browser import Element, Observation, PageTask
from orchard.recipes.gui.miniwob import MiniWoBTask
from orchard.recipes.gui.runner import rollout_task
from orchard.recipes.gui.tasks import GuiTask, miniwob_task

from orchard.rollouts import Limits, ModelEndpoint, Task

PNG = b"\x89PNG\r\n\x1a\n"


def _obs(n: int) -> Observation:
    button = Element("button", 'say "hi"', (0.1, 0.2, 0.3, 0.4), interactive=True)
    field = Element("input", "", (0.5, 0.5, 0.9, 0.6), value="abc", type="text")
    return Observation(PNG + bytes([n]) * 8, "http://127.0.0.1/x.html", "Click.", (button, field))


def _episode(k: int) -> _Episode:
    endpoint = ModelEndpoint("s", "m", "http://proxy/s/c/v1", "", "", "")
    agent = GuiAgent(GuiAgentConfig(keep_screenshots=k))
    return _Episode(agent, Task("t", "do it"), endpoint, Limits(max_steps=5))


def test_only_the_last_k_screenshots_are_sent() -> None:
    ep = _episode(k=2)
    ep.messages.append({"role": "system", "content": "sys"})
    for step in range(4):
        ep.observe(_obs(step), step)
    wire = ep.wire_messages()
    images = [
        p
        for m in wire
        if isinstance(m["content"], list)
        for p in m["content"]
        if p["type"] == "image_url"
    ]
    assert len(images) == 2
    placeholders = [m["content"][1]["text"] for m in wire[1:3]]
    assert placeholders == [
        f"[screenshot after step {i} omitted: only the last 2 are kept]" for i in (0, 1)
    ]
    assert all("_screenshot" not in m for m in wire)
    assert wire[-1]["content"][1]["image_url"]["url"].startswith("data:image/png;base64,")
    transcript = ep.transcript()
    assert all(
        p["type"] == "text"
        for m in transcript
        if isinstance(m["content"], list)
        for p in m["content"]
    )
    assert "16 bytes PNG sha256:" in transcript[-1]["content"][1]["text"]
    assert [m["role"] for m in _episode(k=0).wire_messages()] == []


def test_observation_text_lists_elements_with_boxes() -> None:
    text = observation_text(_obs(0), 3, max_elements=1)
    assert text.splitlines()[:4] == [
        "Observation after step 3:", "URL: http://127.0.0.1/x.html",
        "Elements (tag, text, box x0,y0,x1,y1):", '[0] button "say \\"hi\\"" box=0.100,0.200,0.300,0.400',
    ]  # fmt: skip
    assert text.splitlines()[-1] == "... and 1 more elements"
    assert 'value="abc"' in observation_text(_obs(0), 0, max_elements=5)


def test_the_rollout_task_names_the_environment_task() -> None:
    config = GuiAgentConfig(episode_seconds=120.0)
    task = rollout_task(miniwob_task("click-button"), seed=4)
    assert env_task_of(task, config) == MiniWoBTask("click-button", 4, 120.0)
    web = rollout_task(GuiTask("w", "web", "Find the hours", "https://louvre.fr"))
    assert env_task_of(web, config) == PageTask("https://louvre.fr", "Find the hours")
    assert task.image is not None and task.image.startswith("gui-browser:")
    with pytest.raises(ValueError, match="neither a MiniWoB task nor a url"):
        env_task_of(Task("x", "y"), config)
