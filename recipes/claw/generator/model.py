"""The generator's model calls: each stage's conversation is one recording-proxy session.

A stage (propose, build, revise) talks to the model through ``orchard.rollouts``'
:class:`~orchard.rollouts.ModelProxyClient`: :meth:`GenerationModel.conversation` opens a
session (metadata: the stage and the idea), every :meth:`Conversation.ask` is one OpenAI Chat
call to the session's base URL, and :meth:`Conversation.close` finishes the session and reads
its call records back. The tokens counted are the proxy's records (the upstream's ``usage``,
or the engine's token ids where it gave no usage), not our own estimate, so what the manifest
says a task cost is what the proxy recorded. A build and its repairs are one conversation
(each prompt extends the previous one), so the proxy stitches them into one training sample.

The model's answer is hostile: a non-2xx status, a body that is not a Chat completion, or a
completion over :data:`MAX_ANSWER_BYTES` raises :class:`GenerationModelError` (an
infrastructure fault of the generator, never read as the model's wrong answer).
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from orchard.rollouts import ModelProxyClient, ProxyError, ProxySession

MAX_ANSWER_BYTES = 4 * 1024 * 1024


class GenerationModelError(Exception):
    """The model endpoint failed or answered something that is not a Chat completion."""


@dataclass
class Usage:
    """What model calls cost: calls, prompt and completion tokens, seconds waited."""

    calls: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    seconds: float = 0.0

    def add(self, other: Usage) -> None:
        self.calls += other.calls
        self.prompt_tokens += other.prompt_tokens
        self.completion_tokens += other.completion_tokens
        self.seconds += other.seconds

    def as_dict(self) -> dict[str, Any]:
        return {"calls": self.calls, "prompt_tokens": self.prompt_tokens,
                "completion_tokens": self.completion_tokens,
                "seconds": round(self.seconds, 3)}  # fmt: skip


def _count(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0


def usage_of_records(records: list[dict[str, Any]]) -> Usage:
    """The tokens of a session's call records: ``response.usage`` where the upstream gave it,
    else the lengths of the recorded token ids. Seconds are the records' ``total_ms``."""
    usage = Usage()
    for record in records:
        usage.calls += 1
        response = record.get("response")
        reported = response.get("usage") if isinstance(response, dict) else None
        if isinstance(reported, dict) and reported.get("prompt_tokens") is not None:
            usage.prompt_tokens += _count(reported.get("prompt_tokens"))
            usage.completion_tokens += _count(reported.get("completion_tokens"))
        else:
            for key, attr in (("prompt_token_ids", "prompt_tokens"),
                              ("completion_token_ids", "completion_tokens")):  # fmt: skip
                ids = record.get(key)
                if isinstance(ids, list):
                    setattr(usage, attr, getattr(usage, attr) + len(ids))
        total_ms = record.get("total_ms")
        if isinstance(total_ms, int | float) and total_ms >= 0:
            usage.seconds += total_ms / 1000.0
    return usage


@dataclass
class Conversation:
    """One stage's session: its messages so far and, once closed, its recorded usage."""

    model: GenerationModel
    session: ProxySession
    stage: str
    messages: list[dict[str, Any]] = field(default_factory=list)
    usage: Usage = field(default_factory=Usage)
    closed: bool = False

    async def ask(self, content: str) -> str:
        """Send ``content`` as the next user message; the assistant's text (kept in history)."""
        self.messages.append({"role": "user", "content": content})
        text = await self.model.complete(self.session, self.messages)
        self.messages.append({"role": "assistant", "content": text})
        return text

    async def close(self, reward: float | None = None) -> Usage:
        """Finish the session (``reward``: e.g. 1.0 when its task was kept) and count its
        recorded calls. Closing twice only corrects the reward."""
        try:
            await self.model.proxy.finish(self.session.id, reward)
            if not self.closed:
                self.usage = usage_of_records(await self.model.proxy.calls(self.session.id))
        except ProxyError as err:
            raise GenerationModelError(f"{self.stage}: session {self.session.id}: {err}") from err
        self.closed = True
        return self.usage


class GenerationModel:
    """The model the stages ask: ``model`` served behind ``proxy`` (the recording proxy)."""

    def __init__(
        self,
        proxy: ModelProxyClient,
        model: str,
        *,
        system_prompts: Mapping[str, str],
        sampling: Mapping[str, Any] | None = None,
        timeout: float = 600.0,
        model_version: str = "",
    ) -> None:
        self.proxy = proxy
        self.model = model
        self.system_prompts = dict(system_prompts)
        self.sampling = dict(sampling or {})
        self.model_version = model_version
        self._timeout = aiohttp.ClientTimeout(total=timeout)
        self._http: aiohttp.ClientSession | None = None

    async def aclose(self) -> None:
        if self._http is not None:
            await self._http.close()
            self._http = None

    @contextlib.asynccontextmanager
    async def conversation(
        self, stage: str, metadata: Mapping[str, Any]
    ) -> AsyncIterator[Conversation]:
        """A new session for ``stage``, its system prompt in place; closed (finished, its
        usage counted) on leaving the block."""
        talk = await self.open(stage, metadata)
        try:
            yield talk
        finally:
            await talk.close()

    async def open(self, stage: str, metadata: Mapping[str, Any]) -> Conversation:
        """A new session for ``stage``, its system prompt already in place."""
        if stage not in self.system_prompts:
            raise ValueError(f"no system prompt for stage {stage!r}")
        try:
            session = await self.proxy.create_session(
                self.model_version, {"recipe": "claw-generator", "stage": stage, **metadata}
            )
        except ProxyError as err:
            raise GenerationModelError(f"{stage}: create session: {err}") from err
        return Conversation(self, session, stage,
                            [{"role": "system", "content": self.system_prompts[stage]}])  # fmt: skip

    async def complete(self, session: ProxySession, messages: list[dict[str, Any]]) -> str:
        if self._http is None or self._http.closed:
            self._http = aiohttp.ClientSession(timeout=self._timeout)
        body = {"model": self.model, "messages": messages, **self.sampling}
        url = session.openai_base_url.rstrip("/") + "/chat/completions"
        try:
            async with self._http.post(url, json=body) as answer:
                data = await answer.content.read(MAX_ANSWER_BYTES + 1)
                status = answer.status
        except (aiohttp.ClientError, TimeoutError) as err:
            raise GenerationModelError(f"model call failed: {type(err).__name__}: {err}") from err
        if len(data) > MAX_ANSWER_BYTES:
            raise GenerationModelError(f"model answer over {MAX_ANSWER_BYTES} bytes")
        if status != 200:
            raise GenerationModelError(f"model answered {status}: {data[:300]!r}")
        try:
            message = json.loads(data)["choices"][0]["message"]
            content = message.get("content")
        except (ValueError, KeyError, IndexError, TypeError, AttributeError):
            raise GenerationModelError(f"not a Chat completion: {data[:300]!r}") from None
        if content is not None and not isinstance(content, str):
            raise GenerationModelError(f"message content is a {type(content).__name__}")
        return content or ""
