"""The vision-language browser agent: a screenshot loop as an :class:`orchard.rollouts.Harness`.

It runs in the driver's process, like the SWE recipe's ``BashAgent``: the runner makes the
browser sandbox (:func:`~orchard.recipes.gui.browser.browser_sandbox_options`), the agent
starts the browser server in it (:class:`~orchard.recipes.gui.browser.BrowserEnv`), resets
the task and loops:

1. the model is called over the rollout's proxy session (``ModelEndpoint.openai_base_url``,
   OpenAI Chat with the browser's tools, :data:`~orchard.recipes.gui.actions.TOOLS`); the
   request carries the task, each observation as text (URL, the visible elements with their
   normalised boxes) and each screenshot as an ``image_url`` part with a
   ``data:image/png;base64`` URL. Only the last ``keep_screenshots`` (k) screenshots are sent;
   older ones are replaced by a text placeholder, so the context stays bounded;
2. the reply's format is checked (:func:`~orchard.recipes.gui.reward.check_format`:
   reasoning, then exactly one tool call that parses). A malformed reply is told what was
   wrong and counted; ``malformed_limit`` (3) *consecutive* malformed replies end the episode
   (``stop_reason="malformed"``, TRUNCATED: the reward rule pays -1);
3. a well-formed action is performed in the browser; ``done`` ends the episode (COMPLETED,
   its answer the submission) without touching the page, and so does the task reporting its
   own end (MiniWoB's ``core.endEpisode``: ``stop_reason="env_done"``).

Limits: ``Limits.max_steps`` model calls (the curriculum's step budget), ``max_seconds`` of
wall time: TRUNCATED. Faults: the browser crashing
(:class:`~orchard.recipes.gui.browser.BrowserCrashed`), the sandbox failing (an SDK error) or
the model endpoint failing (unreachable, an error after the retries, an answer that is not a
Chat completion) end the rollout ABORTED with ``fault`` saying which: never a reward.

Rewriting old screenshots into placeholders changes the history each turn, so the recording
proxy sees each call's prompt diverge from the previous one once more than k screenshots
were taken: the samples are then one branch per turn (``prefix_changed``), each token-exact
on its own, which is how a sliding-window agent must be trained anyway.

What the grader needs is on the returned :class:`GuiRun`: the judge's view of the episode
(:attr:`GuiRun.episode`: task, steps, answer, the last screenshots), MiniWoB's ground truth
(``detail["task_reward"]``), and the malformed-turn counts.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import json
import ssl
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import aiohttp

import orchard
from orchard.rollouts import HarnessRun, Limits, ModelEndpoint, Status, Task

from .actions import TOOLS, BadAction, Done, describe_action
from .browser import BrowserCrashed, BrowserEnv, Observation, PageTask, Transport
from .judge import Episode, Step, data_url
from .miniwob import MiniWoBTask, succeeded, task_from_metadata
from .reward import check_format

if TYPE_CHECKING:
    from orchard import AsyncSandbox

RETRY_STATUSES = frozenset({429, 502, 503, 504})

SYSTEM_PROMPT = (
    "You operate a web browser to complete a task. After each action you get the page's URL, "
    "its visible elements (tag, text, and box as x0,y0,x1,y1 fractions of the screenshot) and "
    "a screenshot. Coordinates are fractions of the screenshot: (0, 0) is the top-left corner, "
    "(1, 1) the bottom-right. Each turn: first write your reasoning (what you see, what you do "
    "next and why), then call exactly one tool. Call `done` when the task is complete, with "
    "the answer if the task asks a question."
)


class ModelFailure(Exception):
    """The model endpoint failed (infrastructure: the rollout is ABORTED)."""


class WallTimeUp(Exception):
    """The rollout's wall time ran out while waiting for the model (TRUNCATED)."""


@dataclass(frozen=True)
class GuiAgentConfig:
    system_prompt: str = SYSTEM_PROMPT
    keep_screenshots: int = 3
    """k: the screenshots kept in the model's context (older ones become a placeholder)."""
    judge_screenshots: int = 3
    """The last screenshots handed to the judge."""
    malformed_limit: int = 3
    """Consecutive malformed replies that end the episode (the reward rule's -1)."""
    max_elements: int = 60
    """Elements listed in an observation's text (the rest are counted, not listed)."""
    episode_seconds: float | None = 900.0
    """MiniWoB's own episode time limit (its default 10 s is too short for a model)."""
    model_retries: int = 2
    retry_backoff_seconds: float = 0.5
    request_timeout: float = 600.0
    sampling: Mapping[str, Any] = field(default_factory=dict)
    """Extra Chat body fields (``temperature``, ``max_tokens``, ...)."""
    transport: Transport = "port"
    """How the driver reaches the browser server (``port`` or ``exec``, see BrowserEnv)."""


@dataclass
class GuiRun(HarnessRun):
    """A :class:`HarnessRun` with what the grader needs (the judge's view of the episode)."""

    episode: Episode | None = None
    """The judge's view: task, steps, answer, the last ``judge_screenshots`` screenshots."""


def observation_text(obs: Observation, step: int, max_elements: int) -> str:
    """An observation as the model reads it (the scripted test policies parse this too)."""
    lines = [f"Observation after step {step}:", f"URL: {obs.url}"]
    if obs.action_error:
        lines.append(f"The last action had no effect: {obs.action_error}")
    lines.append("Elements (tag, text, box x0,y0,x1,y1):")
    for i, e in enumerate(obs.elements[:max_elements]):
        extra = ""
        if e.value is not None:
            extra += f" value={json.dumps(e.value[:80])}"
        if e.checked is not None:
            extra += f" checked={str(e.checked).lower()}"
        box = ",".join(f"{v:.3f}" for v in e.box)
        lines.append(f"[{i}] {e.tag} {json.dumps(e.text[:80])} box={box}{extra}")
    if len(obs.elements) > max_elements:
        lines.append(f"... and {len(obs.elements) - max_elements} more elements")
    return "\n".join(lines)


def env_task_of(task: Task, config: GuiAgentConfig) -> MiniWoBTask | PageTask:
    """The environment task a rollout task names: MiniWoB's metadata
    (:func:`~orchard.recipes.gui.miniwob.rollout_task`; its episode time limit defaults to
    ``config.episode_seconds``) or ``metadata["url"]`` (a page and the task's prompt)."""
    if "miniwob" in task.metadata:
        env_task = task_from_metadata(task.metadata)
        if env_task.episode_seconds is None and config.episode_seconds is not None:
            env_task = dataclasses.replace(env_task, episode_seconds=config.episode_seconds)
        return env_task
    url = task.metadata.get("url")
    if isinstance(url, str) and url:
        return PageTask(url, task.prompt)
    raise ValueError(f"task {task.id}: its metadata names neither a MiniWoB task nor a url")


class GuiAgent:
    """The built-in browser harness. One instance serves many concurrent rollouts."""

    name = "gui-vlm"
    needs_tools_layer = False

    def __init__(
        self, config: GuiAgentConfig | None = None, *, ca: str | ssl.SSLContext | None = None
    ) -> None:
        self.config = config or GuiAgentConfig()
        if isinstance(ca, str):
            ca = ssl.create_default_context(cafile=ca)
        self._ssl: ssl.SSLContext | bool = ca if ca is not None else True
        self._http: aiohttp.ClientSession | None = None

    def client(self) -> aiohttp.ClientSession:
        if self._http is None or self._http.closed:
            self._http = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=0, ssl=self._ssl),
                headers={"Content-Type": "application/json"},
            )
        return self._http

    async def aclose(self) -> None:
        if self._http is not None:
            await self._http.close()
            self._http = None

    async def __aenter__(self) -> GuiAgent:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def run(
        self, sandbox: AsyncSandbox, task: Task, model: ModelEndpoint, limits: Limits
    ) -> HarnessRun:
        try:
            env_task = env_task_of(task, self.config)
        except ValueError as err:
            return GuiRun(Status.ABORTED, fault=f"task: {err}")
        env = BrowserEnv(sandbox, transport=self.config.transport)
        episode = _Episode(self, task, model, limits)
        try:
            try:
                await env.start()
                first = await env.reset(env_task)
            except BrowserCrashed as err:
                return episode.end(Status.ABORTED, "browser_crashed", f"browser: {err}")
            except orchard.OrchardError as err:
                return episode.end(Status.ABORTED, "sandbox_failed", f"sandbox: {err}")
            return await episode.run(env, first)
        finally:
            await env.close()


class _Episode:
    def __init__(self, agent: GuiAgent, task: Task, model: ModelEndpoint, limits: Limits) -> None:
        self.agent, self.config, self.task, self.limits = agent, agent.config, task, limits
        self.url = model.openai_base_url.rstrip("/") + "/chat/completions"
        self.model = model.model
        self.messages: list[dict[str, Any]] = []
        self.shots: list[tuple[int, bytes]] = []  # every screenshot's (step, png), in order
        self.steps: list[Step] = []
        self.calls = 0
        self.malformed = 0
        self.streak = 0
        self.last_ok = False
        self.answer: str | None = None
        self.last_obs: Observation | None = None
        self.instruction = task.prompt
        self.started = time.monotonic()
        self.deadline = self.started + limits.max_seconds
        self.model_seconds: list[float] = []
        self.env_seconds: list[float] = []

    # ---- the loop ----------------------------------------------------------------

    async def run(self, env: BrowserEnv, first: Observation) -> GuiRun:
        self.instruction = first.utterance or self.task.prompt
        self.messages.append({"role": "system", "content": self.config.system_prompt})
        self.messages.append({"role": "user", "content": f"Task: {self.instruction}"})
        self.observe(first, 0)
        while True:
            if self.calls >= self.limits.max_steps:
                return self.end(Status.TRUNCATED, "max_steps")
            if time.monotonic() >= self.deadline:
                return self.end(Status.TRUNCATED, "max_seconds")
            try:
                message = await self.complete()
            except WallTimeUp:
                return self.end(Status.TRUNCATED, "max_seconds")
            except ModelFailure as err:
                return self.end(Status.ABORTED, "model_failed", f"model endpoint: {err}")
            self.calls += 1
            check = check_format(message)
            self.messages.append(_kept(message))
            if not check.ok or check.action is None:
                self.malformed += 1
                self.streak += 1
                self.last_ok = False
                self.steps.append(Step(check.reasoning, f"(malformed: {check.reason})"))
                self.tell_all(f"Your reply was malformed: {check.reason}. Write your "
                              "reasoning, then call exactly one tool.", message)  # fmt: skip
                if self.streak >= self.config.malformed_limit:
                    return self.end(Status.TRUNCATED, "malformed")
                continue
            self.streak, self.last_ok = 0, True
            action = check.action
            self.steps.append(Step(check.reasoning, describe_action(action)))
            if isinstance(action, Done):
                self.answer = action.answer
                self.tell("Episode finished.", check.call_id)
                return self.end(Status.COMPLETED, "done", submission=action.answer)
            t0 = time.perf_counter()
            try:
                obs = await env.step(action)
            except BadAction as err:
                self.env_seconds.append(time.perf_counter() - t0)
                self.tell(f"The browser refused the action: {err.reason}", check.call_id)
                continue
            except BrowserCrashed as err:
                return self.end(Status.ABORTED, "browser_crashed", f"browser: {err}")
            except orchard.OrchardError as err:
                return self.end(Status.ABORTED, "sandbox_failed", f"sandbox: {err}")
            self.env_seconds.append(time.perf_counter() - t0)
            self.tell("ok", check.call_id)
            self.observe(obs, self.calls)
            if obs.task_done:
                return self.end(Status.COMPLETED, "env_done")

    def tell(self, text: str, call_id: str | None) -> None:
        """The answer to a tool call (a tool message), or a user message when there is none."""
        if call_id is None:
            self.messages.append({"role": "user", "content": text})
        else:
            self.messages.append({"role": "tool", "tool_call_id": call_id, "content": text})

    def tell_all(self, text: str, message: Mapping[str, Any]) -> None:
        """``text`` as the answer to every call of ``message`` (or a user message if none)."""
        ids = [c.get("id") for c in message.get("tool_calls") or () if isinstance(c, dict)]
        ids = [i for i in ids if isinstance(i, str)]
        if not ids:
            self.tell(text, None)
        for call_id in ids:
            self.tell(text, call_id)

    def observe(self, obs: Observation, step: int) -> None:
        self.last_obs = obs
        self.shots.append((step, obs.png))
        text = observation_text(obs, step, self.config.max_elements)
        self.messages.append({
            "role": "user",
            "content": [{"type": "text", "text": text},
                        {"type": "image_url", "image_url": {"url": data_url(obs.png)}}],
            "_screenshot": step,
        })  # fmt: skip

    def wire_messages(self) -> list[dict[str, Any]]:
        """The history as sent: the last k screenshots as images, older ones as placeholders."""
        k = self.config.keep_screenshots
        shot_messages = [i for i, m in enumerate(self.messages) if "_screenshot" in m]
        keep = set(shot_messages[-k:]) if k > 0 else set()
        out = []
        for i, m in enumerate(self.messages):
            if "_screenshot" not in m:
                out.append(m)
                continue
            wire = {"role": m["role"], "content": m["content"]}
            if i not in keep:
                wire["content"] = [
                    m["content"][0],
                    {"type": "text", "text": f"[screenshot after step {m['_screenshot']} "
                     f"omitted: only the last {k} are kept]"},
                ]  # fmt: skip
            out.append(wire)
        return out

    def transcript(self) -> list[dict[str, Any]]:
        """The history without the image bytes (a digest and size per screenshot)."""
        out = []
        for m in self.messages:
            if "_screenshot" not in m:
                out.append(m)
                continue
            png = next(p for s, p in self.shots if s == m["_screenshot"])
            out.append({"role": m["role"], "content": [
                m["content"][0],
                {"type": "text", "text": f"[screenshot after step {m['_screenshot']}: "
                 f"{len(png)} bytes PNG sha256:{hashlib.sha256(png).hexdigest()[:16]}]"},
            ]})  # fmt: skip
        return out

    def end(
        self, status: Status, reason: str, fault: str | None = None, submission: str | None = None
    ) -> GuiRun:
        obs = self.last_obs
        reward = obs.task_reward if obs is not None else None
        shots = (
            self.shots[-self.config.judge_screenshots :] if self.config.judge_screenshots else []
        )
        detail = {
            "stop_reason": reason, "malformed_turns": self.malformed,
            "malformed_streak": self.streak, "last_turn_ok": self.last_ok,
            "task_reward": reward, "task_done": bool(obs and obs.task_done),
            "truth_success": succeeded(reward) if obs is not None and obs.task_done else
            (False if obs is not None and "miniwob" in self.task.metadata else None),
            "final_url": obs.url if obs is not None else None,
            "instruction": self.instruction, "actions": [s.action for s in self.steps],
            "screenshots": len(self.shots), "seconds": time.monotonic() - self.started,
            "timing": {"model_s": self.model_seconds, "env_s": self.env_seconds},
        }  # fmt: skip
        episode = Episode(self.instruction, list(self.steps), self.answer, reason, shots)
        return GuiRun(status, self.calls, submission, self.transcript(), fault, detail, episode)

    # ---- the model -----------------------------------------------------------------

    async def complete(self) -> dict[str, Any]:
        body = json.dumps({"model": self.model, **self.config.sampling, "tools": TOOLS,
                           "messages": self.wire_messages()}).encode()  # fmt: skip
        http = self.agent.client()
        attempt = 0
        t0 = time.perf_counter()
        try:
            while True:
                remaining = self.deadline - time.monotonic()
                if remaining <= 0:
                    raise WallTimeUp
                timeout = min(self.config.request_timeout, remaining)
                try:
                    async with http.post(
                        self.url, data=body, timeout=aiohttp.ClientTimeout(total=timeout)
                    ) as response:
                        status, content = response.status, await response.read()
                except TimeoutError as err:
                    if timeout < self.config.request_timeout:
                        raise WallTimeUp from err
                    raise ModelFailure(f"no answer within {timeout:.0f} s") from err
                except aiohttp.ClientError as err:
                    if attempt >= self.config.model_retries:
                        raise ModelFailure(f"unreachable: {type(err).__name__}: {err}") from err
                else:
                    if status == 200:
                        return _message_of(content)
                    if status not in RETRY_STATUSES or attempt >= self.config.model_retries:
                        raise ModelFailure(f"answered {status}: {content[:500]!r}")
                attempt += 1
                await asyncio.sleep(self.config.retry_backoff_seconds * 2 ** (attempt - 1))
        finally:
            self.model_seconds.append(time.perf_counter() - t0)


def _message_of(content: bytes) -> dict[str, Any]:
    try:
        message = json.loads(content)["choices"][0]["message"]
    except (ValueError, KeyError, IndexError, TypeError) as err:
        raise ModelFailure(f"not a Chat completion: {content[:300]!r}") from err
    if not isinstance(message, dict):
        raise ModelFailure(f"the choice's message is not an object: {message!r:.200}")
    calls = message.get("tool_calls")
    if calls is not None and not isinstance(calls, list):
        raise ModelFailure(f"tool_calls is not a list: {calls!r:.200}")
    return message


def _kept(message: Mapping[str, Any]) -> dict[str, Any]:
    """The assistant message as it goes back into the history."""
    kept: dict[str, Any] = {"role": "assistant", "content": message.get("content")}
    if message.get("tool_calls"):
        kept["tool_calls"] = message["tool_calls"]
    return kept
