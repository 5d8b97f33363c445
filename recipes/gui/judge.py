"""The LLM judge of a GUI episode: task, action history, final answer and the last screenshots.

The judge is any OpenAI-compatible Chat endpoint that takes images (``image_url`` parts with
``data:image/png;base64,...`` URLs). It is called here over HTTP (aiohttp, what
``orchard.rollouts`` uses) and **not** through the rewards service's judge
(``AsyncRewards.judge``): that RPC takes a template name and a map of *strings*, renders them
into one text user message, and has no field for an image, so it cannot show a screenshot.
The rest of its contract is kept: one JSON verdict, one repair round for a malformed reply,
transient failures (connection errors, 429/5xx) retried with backoff, and a failure is a
:class:`JudgeFailed` (the caller drops the sample), never a verdict of failure.

The prompt (:data:`SYSTEM_PROMPT`, :func:`user_content`; ``JUDGE_TEMPLATE`` is its version,
recorded with every verdict) shows, in this order: the task; the numbered action history
(each step's reasoning cut to ``reasoning_chars`` and its action as a call); the final answer
(or that there was none and why the episode ended); then the last ``screenshots`` (3)
screenshots, oldest first, each labelled with its step. The judge answers
``{"reasoning": "...", "verdict": "SUCCESS" | "FAILURE"}``.
"""

from __future__ import annotations

import asyncio
import base64
import json
import random
import re
import ssl
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import aiohttp

JUDGE_TEMPLATE = "gui_episode@1"
SYSTEM_PROMPT = (
    "You judge whether a web agent completed its task. You see the task, the agent's actions "
    "with its reasoning, its final answer, and the last screenshots of the browser (oldest "
    "first; the last one is the final state). Judge by the evidence on the screenshots and the "
    "answer, not by what the agent claims it did. An episode that ended without the agent "
    "finishing (a step budget, malformed outputs) succeeded only if the final screenshot shows "
    "the task done. Reply with one JSON object only, no prose around it: "
    '{"reasoning": "<one short paragraph>", "verdict": "SUCCESS" or "FAILURE"}.'
)
RETRY_STATUSES = frozenset({429, 500, 502, 503, 504})


class JudgeFailed(Exception):
    """No verdict (the endpoint failed, or answered twice with no valid verdict): drop the sample."""


@dataclass(frozen=True)
class Step:
    """One agent step as the judge sees it."""

    reasoning: str
    action: str
    """The call as text (``click(x=0.41, y=0.3)``) or what was malformed about it."""


@dataclass(frozen=True)
class Episode:
    task: str
    steps: Sequence[Step]
    answer: str | None
    """The ``done`` answer; None when the agent never called ``done``."""
    end: str
    """How the episode ended (``done``, ``env_done``, ``max_steps``, ``malformed``, ...)."""
    screenshots: Sequence[tuple[int, bytes]] = ()
    """(step, PNG) of the last screenshots, oldest first."""


@dataclass(frozen=True)
class Verdict:
    success: bool
    reasoning: str
    model: str
    template: str = JUDGE_TEMPLATE
    attempts: int = 1


class EpisodeJudge(Protocol):
    async def judge(self, episode: Episode) -> Verdict: ...


def data_url(png: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(png).decode()


def _cut(text: str, limit: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def user_content(episode: Episode, reasoning_chars: int = 400) -> list[dict[str, Any]]:
    """The user message's parts: the text, then each screenshot with its label."""
    lines = [f"Task:\n{episode.task}", "", "Actions:"]
    if not episode.steps:
        lines.append("(none)")
    for i, step in enumerate(episode.steps, start=1):
        thought = _cut(step.reasoning, reasoning_chars) if step.reasoning else "(no reasoning)"
        lines.append(f"{i}. {thought}\n   -> {step.action}")
    lines.append("")
    if episode.answer is None:
        lines.append(f"Final answer: none (the episode ended by {episode.end})")
    else:
        lines.append(f"Final answer: {episode.answer!r}")
    lines.append("")
    lines.append(f"The last {len(episode.screenshots)} screenshot(s) follow, oldest first.")
    parts: list[dict[str, Any]] = [{"type": "text", "text": "\n".join(lines)}]
    for number, png in episode.screenshots:
        parts.append({"type": "text", "text": f"Screenshot after step {number}:"})
        parts.append({"type": "image_url", "image_url": {"url": data_url(png)}})
    parts.append({"type": "text", "text": "Did the agent complete the task? Reply with the JSON."})
    return parts


_FENCE = re.compile(r"^```(?:json)?\s*(.*?)\s*```$", re.S)


def read_verdict(text: str) -> tuple[bool, str] | str:
    """(success, reasoning) from a reply, or what is wrong with it (for the repair prompt)."""
    body = text.strip()
    fenced = _FENCE.match(body)
    if fenced:
        body = fenced.group(1)
    try:
        value = json.loads(body)
    except json.JSONDecodeError as exc:
        return f"not JSON ({exc.msg})"
    if not isinstance(value, dict):
        return "not a JSON object"
    verdict = value.get("verdict")
    if not isinstance(verdict, str) or verdict.strip().upper() not in ("SUCCESS", "FAILURE"):
        return 'no "verdict" of "SUCCESS" or "FAILURE"'
    reasoning = value.get("reasoning", "")
    if not isinstance(reasoning, str):
        return '"reasoning" is not a string'
    return verdict.strip().upper() == "SUCCESS", reasoning


@dataclass
class ChatJudge:
    """The judge over ``{base_url}/chat/completions`` with model ``model``."""

    base_url: str
    model: str
    api_key: str = ""
    timeout: float = 120.0
    retries: int = 2
    backoff_seconds: float = 0.5
    max_tokens: int = 512
    reasoning_chars: int = 400
    max_concurrency: int = 8
    ca: ssl.SSLContext | None = None
    _http: aiohttp.ClientSession | None = field(default=None, repr=False)
    _slots: asyncio.Semaphore | None = field(default=None, repr=False)

    def _client(self) -> aiohttp.ClientSession:
        if self._http is None or self._http.closed:
            headers = {"Content-Type": "application/json"}
            if self.api_key:
                headers["Authorization"] = f"Bearer {self.api_key}"
            self._http = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(ssl=self.ca if self.ca is not None else True),
                headers=headers,
            )
        return self._http

    async def aclose(self) -> None:
        if self._http is not None:
            await self._http.close()
            self._http = None

    async def _chat(self, messages: list[dict[str, Any]]) -> str:
        if self._slots is None:
            self._slots = asyncio.Semaphore(self.max_concurrency)
        body = {"model": self.model, "messages": messages, "temperature": 0.0,
                "max_tokens": self.max_tokens}  # fmt: skip
        url = self.base_url.rstrip("/") + "/chat/completions"
        attempt = 0
        while True:
            problem: str
            try:
                async with (
                    self._slots,
                    self._client().post(
                        url, json=body, timeout=aiohttp.ClientTimeout(total=self.timeout)
                    ) as response,
                ):
                    content = await response.read()
                    status = response.status
            except (aiohttp.ClientError, TimeoutError) as err:
                problem = f"unreachable: {type(err).__name__}: {err}"
            else:
                if status == 200:
                    return _content_of(content)
                problem = f"answered {status}: {content[:300]!r}"
                if status not in RETRY_STATUSES:
                    raise JudgeFailed(f"judge endpoint {problem}")
            if attempt >= self.retries:
                raise JudgeFailed(f"judge endpoint {problem} (after {attempt + 1} tries)")
            await asyncio.sleep(random.uniform(0, self.backoff_seconds * 2**attempt))
            attempt += 1

    async def judge(self, episode: Episode) -> Verdict:
        messages: list[dict[str, Any]] = [
            {"role": "system", "content": SYSTEM_PROMPT},
            {"role": "user", "content": user_content(episode, self.reasoning_chars)},
        ]
        for attempt in (1, 2):
            text = await self._chat(messages)
            read = read_verdict(text)
            if not isinstance(read, str):
                return Verdict(read[0], read[1], self.model, attempts=attempt)
            if attempt == 2:
                raise JudgeFailed(f"malformed verdict after one repair: {read}")
            messages += [
                {"role": "assistant", "content": text[:4000]},
                {"role": "user", "content": f"Your reply was not valid: {read}. "
                 "Reply again with only the JSON object."},
            ]  # fmt: skip
        raise AssertionError("unreachable")


def _content_of(raw: bytes) -> str:
    try:
        answer = json.loads(raw)
        content = answer["choices"][0]["message"]["content"]
    except (ValueError, KeyError, IndexError, TypeError) as err:
        raise JudgeFailed(f"the judge's answer is not a Chat completion: {raw[:300]!r}") from err
    if isinstance(content, list):  # content parts
        content = "".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    if not isinstance(content, str):
        raise JudgeFailed(f"the judge's message has no text content: {content!r:.200}")
    return content
