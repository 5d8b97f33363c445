"""The browser environment end to end: real Chromium in real runc sandboxes (the browser
image, ``make browser-image``), MiniWoB++'s own JavaScript as the judge of success.

A scripted policy (tests/recipes/gui/policies.py, the stand-in for a vision model: no small
one ships offline) reads ``Observation.elements`` and acts through the same tool calls a
model sends (``parse_action``). What is checked: the task's ground-truth reward says
success for the right actions and failure for wrong ones; the screenshots are PNGs of the
viewport's pixel size, not blank, with the target element drawn where its box says and
typed text visible; bad actions are clear errors and the episode goes on; a killed
Chromium or server, a killed renderer (the page crashed) and a page that runs the sandbox
out of memory are ``BrowserCrashed`` (an infrastructure fault), and a later reset does not
hide it; several browsers run at once, each in its own memory-capped sandbox; the ``exec``
transport works like the port.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from orchard.executor.oom import parse_oom_kills
from orchard.recipes.gui import image as gui_image
from orchard.recipes.gui.actions import BadAction, Click, Key, Navigate, Wait, parse_action
from orchard.recipes.gui.browser import (
    SERVER_PATH_IN_SANDBOX,
    BrowserCrashed,
    BrowserEnv,
    Element,
    Observation,
    PageTask,
    browser_sandbox_options,
)
from orchard.recipes.gui.miniwob import SCRIPTED, MiniWoBTask, succeeded
from PIL import Image

import orchard
from tests.cgroup_paths import sandbox_cgroup_dirs
from tests.recipes.gui import policies
from tests.stack import IMAGES_DIR, REQUIRES_STACK, Stack, running_stack

pytestmark = [
    *REQUIRES_STACK,
    pytest.mark.skipif(
        not gui_image.is_built(IMAGES_DIR),
        reason=f"no {gui_image.image_name()} in {IMAGES_DIR} (make browser-image)",
    ),
    pytest.mark.timeout(240),
]

VIEWPORT = (160, 210)
SCALE = 2.0
# Every Chromium renderer in the sandbox, SIGKILLed: the page crashes, the browser lives on.
KILL_RENDERERS = ["pkill", "-KILL", "-f", "--", "--type=renderer"]
# A page that, clicked anywhere, fills memory until the sandbox's cgroup OOM-kills a process
# (typed arrays live outside V8's heap, so V8's own heap limit does not stop it first).
MEMORY_HOG_HTML = b"""<!doctype html><html><body style="margin:0">
<button style="width:100%;height:100vh" onclick="hog()">hog</button><script>
const keep = [];
function hog() { for (;;) { const a = new Uint8Array(32 << 20); a.fill(1); keep.push(a); } }
</script></body></html>"""
# A page whose script, clicked, never gives the renderer back (an endless loop).
SPIN_HTML = b"""<!doctype html><html><body style="margin:0">
<button style="width:100%;height:100vh" onclick="for (;;) {}">spin</button></body></html>"""


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    with running_stack(tmp_path_factory.mktemp("gui") / "home") as running:
        yield running


def _client(stack: Stack) -> orchard.AsyncOrchard:
    key = (stack.home / "dev-api-key").read_text().strip()
    return orchard.AsyncOrchard(stack.endpoint, key)


@contextlib.asynccontextmanager
async def _browser(stack: Stack, **kwargs: Any) -> AsyncIterator[BrowserEnv]:
    """A browser sandbox on the stack (deleted on exit) with its server started."""
    async with _client(stack) as client:
        env = await BrowserEnv.create(client, viewport=VIEWPORT, scale=SCALE, **kwargs)
        async with env:
            yield env


def _image(png: bytes) -> np.ndarray:
    """The screenshot as an (h, w, 3) int array (PIL decodes it: it must be a real PNG)."""
    img = Image.open(io.BytesIO(png))
    assert img.format == "PNG"
    return np.asarray(img.convert("RGB"), dtype=np.int32)


def assert_screenshot(obs: Observation) -> np.ndarray:
    """A PNG of the viewport's pixel size with real content (not one flat colour)."""
    pixels = _image(obs.png)
    assert pixels.shape == (int(VIEWPORT[1] * SCALE), int(VIEWPORT[0] * SCALE), 3)
    spread = float(pixels.mean(axis=2).std())
    assert spread > 10, f"the screenshot is nearly blank (grey-level stddev {spread:.1f})"
    return pixels


def _region(pixels: np.ndarray, element: Element) -> np.ndarray:
    x0, y0, x1, y1 = element.box
    h, w = pixels.shape[:2]
    left, top = int(x0 * w), int(y0 * h)
    return pixels[top : max(int(y1 * h), top + 1), left : max(int(x1 * w), left + 1)]


def assert_drawn(pixels: np.ndarray, element: Element) -> None:
    """The element's box holds pixels that are not the page's background (its border, fill
    or glyphs are drawn where the box says), i.e. what the policy aims at is visible."""
    colours, counts = np.unique(pixels.reshape(-1, 3), axis=0, return_counts=True)
    background = colours[counts.argmax()]
    region = _region(pixels, element)
    differing = np.abs(region - background).sum(axis=2) > 60
    assert differing.mean() > 0.02, f"{element} is not visible in the screenshot"


def _oom_kills(sandbox_id: str) -> int:
    """The kernel's OOM-kill counter of the sandbox's memory cgroup (read on the host)."""
    for controller, name in (("memory", "memory.oom_control"), ("unified", "memory.events")):
        for folder in sandbox_cgroup_dirs(sandbox_id, controller):
            path = Path(folder) / name
            if path.exists():
                kills = parse_oom_kills(path.read_bytes())
                if kills is not None:
                    return kills
    raise AssertionError(f"no readable OOM counter for {sandbox_id}")


async def _episode(env: BrowserEnv, name: str, seed: int) -> tuple[Observation, Observation]:
    """Reset on ``name`` and play the scripted policy; (first, last) observations."""
    first = await env.reset(MiniWoBTask(name, seed=seed, episode_seconds=120))
    assert first.utterance and not first.task_done and first.task_reward is None
    obs = first
    for call_name, arguments in policies.solve(name, first):
        assert not obs.task_done, f"{name} ended early: {obs.task_reward} {obs.task_reason}"
        obs = await env.step(parse_action(call_name, arguments))
    return first, obs


def test_scripted_policy_solves_several_miniwob_tasks(stack: Stack, tmp_path: Path) -> None:
    async def scenario() -> None:
        async with _browser(stack) as env:
            for seed, name in enumerate(SCRIPTED):
                first, last = await _episode(env, name, seed)
                img = assert_screenshot(first)
                for call_name, args in policies.solve(name, first):
                    if call_name == "click":  # the element aimed at is drawn there
                        hit = [e for e in first.elements if e.center == (args["x"], args["y"])]
                        assert_drawn(img, hit[0])
                assert last.task_done, name
                assert succeeded(last.task_reward), (name, last.task_reward, last.task_reason)
                assert_screenshot(last)  # the final page, not MiniWoB's START cover
                assert first.url.endswith(f"/miniwob/{name}.html")
                (tmp_path / f"{name}.png").write_bytes(first.png)

    asyncio.run(scenario())


def test_text_is_typed_into_the_field_and_shows(stack: Stack) -> None:
    async def scenario() -> None:
        async with _browser(stack) as env:
            first = await env.reset(MiniWoBTask("enter-text", seed=7, episode_seconds=120))
            field = policies.by_id(first, "tt")
            assert field.value == ""
            target = policies.quoted(first.utterance)
            x, y = field.center
            typed = await env.step(parse_action("type", {"text": target, "x": x, "y": y}))
            assert policies.by_id(typed, "tt").value == target  # the keystrokes landed
            assert not typed.task_done  # enter-text ends on Submit, not on typing
            before = _region(_image(first.png), field)
            after = _region(_image(typed.png), field)
            assert before.shape == after.shape
            changed = int((np.abs(before - after).sum(axis=2) > 60).sum())
            assert changed > 20, "the typed text does not show in the field"

    asyncio.run(scenario())


def test_a_wrong_policy_is_scored_as_failing_by_the_task(stack: Stack) -> None:
    async def scenario() -> None:
        async with _browser(stack) as env:
            wrong: Any = None
            for seed in range(20):  # a layout with at least two buttons
                obs = await env.reset(MiniWoBTask("click-button", seed=seed, episode_seconds=120))
                wrong = policies.wrong_button(obs)
                if wrong is not None:
                    break
            assert wrong is not None, "no click-button layout with two buttons in 20 seeds"
            end = await env.step(parse_action(*wrong))
            assert end.task_done and end.task_reward is not None
            assert not succeeded(end.task_reward) and end.task_reward < 0
            # the result is latched: more clicks (where the START cover was) change nothing
            again = await env.step(Click(0.5, 0.5))
            assert again.task_done and again.task_reward == end.task_reward
            # wrong text into enter-text: also a failure by the task's own check
            first = await env.reset(MiniWoBTask("enter-text", seed=3, episode_seconds=120))
            x, y = policies.by_id(first, "tt").center
            await env.step(parse_action("type", {"text": "not the name", "x": x, "y": y}))
            end = await env.step(parse_action(*policies.click(policies.by_id(first, "subbtn"))))
            assert end.task_done and not succeeded(end.task_reward)

    asyncio.run(scenario())


def test_bad_actions_are_clear_errors_and_the_episode_goes_on(stack: Stack) -> None:
    async def scenario() -> None:
        async with _browser(stack) as env:
            first = await env.reset(MiniWoBTask("click-button", seed=1, episode_seconds=120))
            with pytest.raises(BadAction, match="outside the screen"):
                parse_action("click", '{"x": 2, "y": 0.5}')
            with pytest.raises(BadAction, match="not valid JSON"):
                parse_action("click", "{x: 0.5")
            # well-formed, but the browser has no such key: refused by the browser, clearly
            with pytest.raises(BadAction, match=r"(?i)unknown key"):
                await env.step(Key("NoSuchKey"))
            # a page that cannot load (the sandbox has no network; nothing on port 1)
            failed = await env.step(Navigate("http://127.0.0.1:1/"))
            assert failed.action_error is not None and "navigation failed" in failed.action_error
            await env.step(parse_action("back", "{}"))
            # the environment still works: the task is solvable after all that
            again = await env.reset(MiniWoBTask("click-button", seed=1, episode_seconds=120))
            assert again.utterance == first.utterance
            end = await env.step(parse_action(*policies.solve("click-button", again)[0]))
            assert succeeded(end.task_reward)

    asyncio.run(scenario())


def test_a_killed_browser_is_an_infrastructure_fault(stack: Stack) -> None:
    async def scenario() -> None:
        async with _browser(stack) as env:
            await env.reset(MiniWoBTask("click-button", seed=2, episode_seconds=120))
            killed = await env.sandbox.exec(["pkill", "-9", "-f", "/usr/lib/chromium/chromium"])
            assert killed.exit_code == 0, killed.stderr_text
            with pytest.raises(BrowserCrashed) as caught:
                await env.step(Click(0.5, 0.5))
            assert caught.value.is_infrastructure
            assert caught.value.reason == "BROWSER_CRASHED"
        # the server itself gone: the same fault, not a hang
        async with _browser(stack) as env:
            await env.reset(MiniWoBTask("click-button", seed=2, episode_seconds=120))
            servers = [p for p in await env.sandbox.processes() if SERVER_PATH_IN_SANDBOX in p.argv]
            assert len(servers) == 1
            await (await env.sandbox.process(servers[0].id)).kill()
            with pytest.raises(BrowserCrashed):
                await env.step(Click(0.5, 0.5))

    asyncio.run(scenario())


def test_a_crashed_page_is_an_infrastructure_fault_a_reset_does_not_hide(stack: Stack) -> None:
    task = MiniWoBTask("click-button", seed=2, episode_seconds=120)

    async def kill_renderers(env: BrowserEnv) -> None:
        killed = await env.sandbox.exec(KILL_RENDERERS)
        assert killed.exit_code == 0, killed.stderr_text  # at least one renderer was there

    async def scenario() -> None:
        # the renderer dies under an episode; the browser process and the server live on
        async with _browser(stack) as env:
            await env.reset(task)
            await kill_renderers(env)
            with pytest.raises(BrowserCrashed, match="page crashed") as caught:
                await env.step(Click(0.5, 0.5))
            assert caught.value.is_infrastructure
            assert caught.value.reason == "BROWSER_CRASHED"
            # latched: neither a screenshot nor a new episode pretends all is well
            with pytest.raises(BrowserCrashed, match="page crashed"):
                await env.screenshot()
            with pytest.raises(BrowserCrashed, match="page crashed"):
                await env.reset(task)
        # seen first by a screenshot (no action), or first by the next reset
        async with _browser(stack) as env:
            await env.reset(task)
            await kill_renderers(env)
            with pytest.raises(BrowserCrashed, match="page crashed"):
                await env.screenshot()
        async with _browser(stack) as env:
            await env.reset(task)
            await kill_renderers(env)
            with pytest.raises(BrowserCrashed, match="page crashed"):
                await env.reset(task)

    asyncio.run(scenario())


def test_a_page_that_runs_the_sandbox_out_of_memory_is_an_infrastructure_fault(
    stack: Stack,
) -> None:
    async def scenario() -> None:
        async with _client(stack) as client:
            options = browser_sandbox_options(memory=512 << 20)
            env = await BrowserEnv.create(client, options, viewport=VIEWPORT, scale=SCALE)
            async with env:
                await env.sandbox.write_file("/tmp/hog.html", MEMORY_HOG_HTML)
                page = await env.reset(PageTask("file:///tmp/hog.html", "click"))
                assert page.url == "file:///tmp/hog.html"
                # The kernel picks the victim by size and oom_score_adj: so far always the
                # hog's renderer ("page crashed"); the sandbox's own processes (adj 500) could
                # be picked instead, which must be the same fault, so the reason is not pinned.
                with pytest.raises(BrowserCrashed) as caught:
                    await env.step(Click(0.5, 0.5))
                assert caught.value.is_infrastructure
                with pytest.raises(BrowserCrashed):
                    await env.reset(MiniWoBTask("click-button", seed=2, episode_seconds=120))
                # the kernel's OOM killer did it (the cgroup's counter), not V8's heap limit
                assert _oom_kills(env.sandbox.id) >= 1

    asyncio.run(scenario())


def test_a_request_past_its_deadline_leaves_no_late_answer_behind(stack: Stack) -> None:
    async def scenario() -> None:
        # a slow step: the driver gives up at its deadline, the server answers later; that
        # late answer must not pass for the answer to the next request
        async with _browser(stack) as env:
            await env.reset(MiniWoBTask("click-button", seed=2, episode_seconds=120))
            env.request_timeout = 2.0
            with pytest.raises(BrowserCrashed, match="no answer"):
                await env.step(Wait(5.0))
            await asyncio.sleep(4.0)  # the step's answer is in by now
            with pytest.raises(BrowserCrashed, match="no answer") as caught:
                await env.observe()
            assert caught.value.is_infrastructure
            with pytest.raises(BrowserCrashed, match="no answer"):
                await env.reset(MiniWoBTask("click-button", seed=2, episode_seconds=120))
        # the caller's own deadline cancels a step mid-way: the same, nothing more is sent
        async with _browser(stack) as env:
            await env.reset(MiniWoBTask("click-button", seed=2, episode_seconds=120))
            with pytest.raises(TimeoutError):
                await asyncio.wait_for(env.step(Wait(3.0)), 1.0)
            await asyncio.sleep(3.0)
            with pytest.raises(BrowserCrashed, match="cut off"):
                await env.observe()
        # a page in an endless loop: the same fault at the deadline, and close() still returns
        async with _browser(stack) as env:
            await env.sandbox.write_file("/tmp/spin.html", SPIN_HTML)
            await env.reset(PageTask("file:///tmp/spin.html", "click"))
            env.request_timeout = 5.0
            with pytest.raises(BrowserCrashed, match="no answer"):
                await env.step(Click(0.5, 0.5))

    asyncio.run(scenario())


def test_many_browsers_at_once_each_in_its_own_capped_sandbox(stack: Stack) -> None:
    count, memory = 3, 512 << 20

    async def one(client: orchard.AsyncOrchard, seed: int) -> tuple[str, int, float | None]:
        options = browser_sandbox_options(memory=memory)
        async with await BrowserEnv.create(client, options, viewport=VIEWPORT, scale=SCALE) as env:
            info = await env.sandbox.info()
            _, last = await _episode(env, "click-button", seed)
            return env.sandbox.id, info.memory_bytes, last.task_reward

    async def scenario() -> None:
        async with _client(stack) as client:
            results = await asyncio.gather(*(one(client, seed) for seed in range(count)))
        assert len({sandbox_id for sandbox_id, _, _ in results}) == count
        assert all(cap == memory for _, cap, _ in results)
        assert all(succeeded(reward) for _, _, reward in results), results

    asyncio.run(scenario())


def test_the_exec_transport_plays_like_the_port(stack: Stack) -> None:
    async def scenario() -> None:
        async with _browser(stack, transport="exec") as env:
            _, last = await _episode(env, "click-checkboxes", 5)
            assert succeeded(last.task_reward)

    asyncio.run(scenario())
