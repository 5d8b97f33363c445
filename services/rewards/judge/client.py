"""The judge: one rubric template + inputs -> a schema-checked JSON verdict, or "no verdict".

Through the ``openai`` client against any OpenAI-compatible endpoint (vLLM,
llama.cpp's server, a hosted API). The client's own retries are off; ours:

- transient failures (429, 5xx, timeouts, connection errors) are retried up to
  ``max_retries`` times with exponential backoff and full jitter;
- a reply that is not JSON or breaks the template's schema gets exactly one
  repair attempt (the model sees its reply and the error);
- at most ``max_concurrency`` calls are in flight per judge;
- real verdicts are cached by (template name@version, model, inputs);
- whatever fails ends as ``Verdict(ok=False, failure=...)``: never a silent 0.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import openai

from .cache import VerdictCache, cache_key
from .schema import schema_errors
from .templates import RubricTemplate

_FENCED_JSON = re.compile(r"```(?:json)?\s*(\{.*\})\s*```", re.DOTALL)


@dataclass(frozen=True)
class JudgeSettings:
    base_url: str = field(default_factory=lambda: os.environ.get("ORCHARD_JUDGE_BASE_URL", ""))
    """OpenAI-compatible endpoint, e.g. ``http://127.0.0.1:8000/v1``."""
    model: str = field(default_factory=lambda: os.environ.get("ORCHARD_JUDGE_MODEL", ""))
    api_key: str = field(default_factory=lambda: os.environ.get("ORCHARD_JUDGE_API_KEY", "none"))
    """Local servers ignore it; the client insists on one."""
    timeout_seconds: float = 60.0
    max_retries: int = 3
    backoff_base_seconds: float = 0.5
    backoff_max_seconds: float = 8.0
    max_concurrency: int = 8
    temperature: float = 0.0
    max_tokens: int = 1024
    cache_path: Path | None = None


@dataclass(frozen=True)
class Verdict:
    ok: bool
    data: dict[str, Any] = field(default_factory=dict)
    failure: str = ""
    """Why there is no verdict (``ok`` False): the last error."""
    cached: bool = False
    attempts: int = 0
    template: str = ""
    model: str = ""


class JudgeUnavailableError(RuntimeError):
    """The judge has no endpoint or model configured."""


def parse_json_reply(text: str) -> Any:
    """The JSON object in a reply: bare, fenced, or the outermost ``{...}`` in prose."""
    text = text.strip()
    found = _FENCED_JSON.search(text)
    if found:
        text = found.group(1)
    elif not text.startswith("{"):
        start, end = text.find("{"), text.rfind("}")
        if start != -1 and end > start:
            text = text[start : end + 1]
    return json.loads(text)


_TRANSIENT = (openai.RateLimitError, openai.APITimeoutError, openai.APIConnectionError)


def _is_transient(exc: Exception) -> bool:
    if isinstance(exc, _TRANSIENT):
        return True
    return isinstance(exc, openai.APIStatusError) and exc.status_code >= 500


class Judge:
    """Async judge; share one per endpoint (it holds the HTTP client, semaphore and cache)."""

    def __init__(self, settings: JudgeSettings, cache: VerdictCache | None = None) -> None:
        self.settings = settings
        self.cache = cache if cache is not None else VerdictCache(settings.cache_path)
        self._slots = asyncio.Semaphore(settings.max_concurrency)
        self._client: openai.AsyncOpenAI | None = None

    def _openai(self) -> openai.AsyncOpenAI:
        if not self.settings.base_url or not self.settings.model:
            raise JudgeUnavailableError(
                "no judge configured: set ORCHARD_JUDGE_BASE_URL and ORCHARD_JUDGE_MODEL"
            )
        if self._client is None:
            self._client = openai.AsyncOpenAI(
                base_url=self.settings.base_url,
                api_key=self.settings.api_key or "none",
                timeout=self.settings.timeout_seconds,
                max_retries=0,
            )
        return self._client

    async def close(self) -> None:
        if self._client is not None:
            await self._client.close()
            self._client = None

    async def _chat(self, messages: list[dict[str, str]]) -> str:
        """One completion, with transient failures retried (backoff + full jitter)."""
        client = self._openai()
        attempt = 0
        while True:
            try:
                async with self._slots:
                    reply = await client.chat.completions.create(
                        model=self.settings.model,
                        messages=messages,  # type: ignore[arg-type]
                        temperature=self.settings.temperature,
                        max_tokens=self.settings.max_tokens,
                    )
                return reply.choices[0].message.content or ""
            except openai.APIError as exc:
                if not _is_transient(exc) or attempt >= self.settings.max_retries:
                    raise
                cap = min(
                    self.settings.backoff_max_seconds,
                    self.settings.backoff_base_seconds * 2**attempt,
                )
                await asyncio.sleep(random.uniform(0, cap))
                attempt += 1

    async def judge(self, template: RubricTemplate, inputs: Mapping[str, str]) -> Verdict:
        key = cache_key(template.key, self.settings.model, inputs)
        hit = self.cache.get(key)
        if hit is not None:
            return Verdict(True, hit, cached=True, template=template.key, model=self.settings.model)
        try:
            prompt = template.render(inputs)
        except KeyError as exc:
            return Verdict(False, failure=str(exc.args[0]), template=template.key)
        messages = [
            {"role": "system", "content": template.system},
            {"role": "user", "content": prompt},
        ]
        for attempts, repair in enumerate((False, True), 1):
            try:
                text = await self._chat(messages)
            except JudgeUnavailableError as exc:
                return Verdict(False, failure=str(exc), attempts=0, template=template.key)
            except openai.APIError as exc:
                return Verdict(
                    False, failure=f"endpoint error: {type(exc).__name__}: {exc}"[:500],
                    attempts=attempts, template=template.key, model=self.settings.model,
                )  # fmt: skip
            problem = _problem_with(text, template)
            if isinstance(problem, dict):
                self.cache.put(key, problem)
                return Verdict(
                    True,
                    problem,
                    attempts=attempts,
                    template=template.key,
                    model=self.settings.model,
                )
            if repair:
                return Verdict(
                    False, failure=f"malformed verdict after one repair: {problem}"[:500],
                    attempts=attempts, template=template.key, model=self.settings.model,
                )  # fmt: skip
            messages = [
                *messages,
                {"role": "assistant", "content": text[:4000]},
                {
                    "role": "user",
                    "content": f"Your reply was not valid: {problem}. Reply again with only the JSON object.",
                },
            ]
        raise AssertionError("unreachable")


def _problem_with(text: str, template: RubricTemplate) -> dict[str, Any] | str:
    """The verdict when valid, else the error text for the repair prompt."""
    try:
        value = parse_json_reply(text)
    except json.JSONDecodeError as exc:
        return f"not JSON ({exc.msg})"
    if not isinstance(value, dict):
        return "not a JSON object"
    errors = schema_errors(value, template.schema) if template.schema else []
    return "; ".join(errors[:5]) if errors else value
