"""The built-in ReAct loop: a driver-side :class:`~orchard.recipes.claw.runner.ClawHarness` whose
tools are the task's mock services (their ``tool_specs``), plus ``final_answer``, plus
(optionally) ``bash`` in the sandbox.

It runs in the driver's process: the model is called over the rollout's proxy session
(``ModelEndpoint.openai_base_url``, OpenAI Chat with function tools) and each tool call goes
to the in-sandbox services through :meth:`ClawServices.call_tool` (so it lands in their audit
log like any agent's call) or, for ``bash``, to ``AsyncSandbox.exec``. The loop stops when:

- the model calls ``final_answer`` (``{"answer": "..."}``), or replies with text and no tool
  call (that text is the answer): ``COMPLETED``, the answer is the run's ``submission``;
- a limit is hit (``Limits.max_steps`` model calls, ``max_seconds``, ``max_tokens`` of
  context as the endpoint reports it, or ``ReactConfig.max_format_errors``): ``TRUNCATED``;
- the model endpoint fails (unreachable or an error status after the retries, an answer
  that is not a Chat completion), the sandbox fails, or the services fail for a reason that
  is not the agent's: ``ABORTED`` with the fault.

Malformed calls are the model's mistakes, told to it and counted (``detail["format_errors"]``):
an empty reply, a call to a tool that was not offered, ``final_answer`` without a string
``answer``, a ``bash`` call without a ``command``. Arguments that are not JSON, or do not fit
a service tool's schema, go to the service, which refuses them with an error the model sees
(and the audit log records). The history is sent back exactly as the model produced it, so
the proxy's samples stitch.

Why our own loop (and not the SWE recipe's ``BashAgent``): the tools are the services', the
answer is a tool call, and a malformed call is answered per tool; the loop is short, and the
SWE loop's byte-level history encoding matters less for a handful of tool calls per task.
What is the same is shared: the endpoint's failure (``ModelFailure``), the parsing of a tool
call and the head/tail cut of a command's output come from ``orchard.recipes.swe.agent``.
"""

from __future__ import annotations

import asyncio
import json
import ssl
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import aiohttp
from orchard.recipes.swe.agent import RETRY_STATUSES, ModelFailure, parse_call, truncate

import orchard
from orchard.rollouts import HarnessRun, Status

from .harness import TrialContext
from .services import ServicesError

if TYPE_CHECKING:
    pass

FINAL_ANSWER = "final_answer"
BASH = "bash"

SYSTEM_PROMPT = """\
You are a personal assistant working for the user through tools: their mail, calendar, \
contacts, files, to-do list and web search, as the tools offered to you show. Do exactly \
what the user asks, using the tools; do not change or delete anything they did not ask you \
to change, and do not use services the task does not need. Look things up before you act \
on them (ids, addresses, times). When you are done, call `final_answer` with a short answer \
for the user (what you did, or the information they asked for)."""

TASK_TEMPLATE = """\
{prompt}

(The current date and time is {now}.)"""

FINAL_ANSWER_TOOL = {
    "type": "function",
    "function": {
        "name": FINAL_ANSWER,
        "description": "Finish the task: give the user your answer (what you did, or what they asked).",
        "parameters": {
            "type": "object",
            "properties": {"answer": {"type": "string", "description": "the answer"}},
            "required": ["answer"],
        },
    },
}

BASH_TOOL = {
    "type": "function",
    "function": {
        "name": BASH,
        "description": "Run one shell command in the task's working folder; returns its output.",
        "parameters": {
            "type": "object",
            "properties": {"command": {"type": "string"}},
            "required": ["command"],
        },
    },
}


class _WallTimeUp(Exception):
    pass


@dataclass(frozen=True)
class ReactConfig:
    """How the loop talks to the model. ``bash``: offer a ``bash`` tool in the sandbox too
    (None: only when the task has no services, as claw-bench's file tasks)."""

    system_prompt: str = SYSTEM_PROMPT
    task_template: str = TASK_TEMPLATE
    bash: bool | None = None
    max_format_errors: int = 5
    model_retries: int = 2
    retry_backoff_seconds: float = 0.5
    request_timeout: float = 600.0
    sampling: Mapping[str, Any] = field(default_factory=dict)
    name: str = "react"


@dataclass(frozen=True)
class _Bad:
    reason: str


class ReactHarness:
    """The built-in ReAct harness (``name`` from the config: ``react``). One instance serves
    many concurrent trials; ``aclose()`` when done."""

    needs_tools_layer = False
    runs_in_sandbox = False

    def __init__(
        self, config: ReactConfig | None = None, *, ca: str | ssl.SSLContext | None = None
    ) -> None:
        self.config = config or ReactConfig()
        self.name = self.config.name
        if isinstance(ca, str):
            ca = ssl.create_default_context(cafile=ca)
        self._ssl: ssl.SSLContext | bool = ca if ca is not None else True
        self._http: aiohttp.ClientSession | None = None

    def client(self) -> aiohttp.ClientSession:
        if self._http is None or self._http.closed:
            self._http = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=0, ssl=self._ssl)
            )
        return self._http

    async def aclose(self) -> None:
        if self._http is not None:
            await self._http.close()
            self._http = None

    async def run_claw(self, trial: TrialContext) -> HarnessRun:
        return await _Loop(self, trial).run()


class _Loop:
    def __init__(self, harness: ReactHarness, trial: TrialContext) -> None:
        self.harness, self.config = harness, harness.config
        self.sandbox, self.task, self.limits = trial.sandbox, trial.task, trial.limits
        self.services = services = trial.services
        model, limits = trial.model, trial.limits
        self.url = model.openai_base_url.rstrip("/") + "/chat/completions"
        self.model = model.model
        bash = self.config.bash if self.config.bash is not None else services is None
        self.tools = [*(services.tool_specs() if services else []), FINAL_ANSWER_TOOL]
        if bash:
            self.tools.append(BASH_TOOL)
        self.names = {t["function"]["name"] for t in self.tools}
        self.messages: list[dict[str, Any]] = []
        self.steps = 0
        self.format_errors = 0
        self.tool_calls = 0
        self.context_tokens: int | None = None
        self.started = time.monotonic()
        self.deadline = self.started + limits.max_seconds

    def end(
        self, status: Status, reason: str, fault: str | None = None, answer: str | None = None
    ) -> HarnessRun:
        detail = {
            "stop_reason": reason,
            "format_errors": self.format_errors,
            "tool_calls": self.tool_calls,
            "context_tokens": self.context_tokens,
            "seconds": round(time.monotonic() - self.started, 4),
        }
        return HarnessRun(status, self.steps, answer, self.messages, fault, detail)

    async def run(self) -> HarnessRun:
        now = self.task.fixtures.now.isoformat() if self.task.fixtures else "unknown"
        self.messages.append({"role": "system", "content": self.config.system_prompt})
        prompt = self.config.task_template.format(prompt=self.task.prompt, now=now)
        self.messages.append({"role": "user", "content": prompt})
        limits = self.limits
        while True:
            if self.steps >= limits.max_steps:
                return self.end(Status.TRUNCATED, "max_steps")
            if time.monotonic() >= self.deadline:
                return self.end(Status.TRUNCATED, "max_seconds")
            if limits.max_tokens is not None and (self.context_tokens or 0) >= limits.max_tokens:
                return self.end(Status.TRUNCATED, "max_tokens")
            if self.format_errors >= self.config.max_format_errors:
                return self.end(Status.TRUNCATED, "format_errors")
            try:
                message = await self.complete()
            except _WallTimeUp:
                return self.end(Status.TRUNCATED, "max_seconds")
            except ModelFailure as err:
                return self.end(Status.ABORTED, "model_failed", f"model endpoint: {err}")
            self.steps += 1
            try:
                answer = await self.act(message)
            except ModelFailure as err:
                return self.end(Status.ABORTED, "model_failed", f"model endpoint: {err}")
            except orchard.OrchardError as err:
                return self.end(
                    Status.ABORTED, "sandbox_failed", f"sandbox: {type(err).__name__}: {err}"
                )
            except ServicesError as err:
                if err.fault == "task":  # the agent broke its services: graded (they say how)
                    return self.end(Status.TRUNCATED, "services_lost", answer=None)
                return self.end(
                    Status.ABORTED, "services_failed", f"services: {type(err).__name__}: {err}"
                )
            if answer is not None:
                return self.end(Status.COMPLETED, "answered", answer=answer)

    async def complete(self) -> dict[str, Any]:
        body = {
            "model": self.model,
            "messages": self.messages,
            "tools": self.tools,
            **self.config.sampling,
        }
        data = json.dumps(body).encode()
        attempt = 0
        while True:
            remaining = self.deadline - time.monotonic()
            if remaining <= 0:
                raise _WallTimeUp
            timeout = min(self.config.request_timeout, remaining)
            try:
                async with self.harness.client().post(
                    self.url,
                    data=data,
                    headers={"Content-Type": "application/json"},
                    timeout=aiohttp.ClientTimeout(total=timeout),
                ) as response:
                    status, content = response.status, await response.read()
            except TimeoutError as err:
                if timeout < self.config.request_timeout:
                    raise _WallTimeUp from err
                raise ModelFailure(f"no answer within {timeout:.0f} s") from err
            except aiohttp.ClientError as err:
                if attempt >= self.config.model_retries:
                    raise ModelFailure(f"unreachable: {type(err).__name__}: {err}") from err
            else:
                if status == 200:
                    return self.read(content)
                if status not in RETRY_STATUSES or attempt >= self.config.model_retries:
                    raise ModelFailure(f"answered {status}: {content[:500]!r}")
            attempt += 1
            await asyncio.sleep(self.config.retry_backoff_seconds * 2 ** (attempt - 1))

    def read(self, content: bytes) -> dict[str, Any]:
        try:
            answer = json.loads(content)
            message = answer["choices"][0]["message"]
        except (ValueError, KeyError, IndexError, TypeError) as err:
            raise ModelFailure(f"not a Chat completion: {content[:300]!r}") from err
        if not isinstance(message, dict):
            raise ModelFailure(f"the choice's message is not an object: {message!r:.200}")
        usage = answer.get("usage")
        if isinstance(usage, dict) and isinstance(usage.get("total_tokens"), int):
            self.context_tokens = usage["total_tokens"]
        calls = message.get("tool_calls")
        if calls is not None and not isinstance(calls, list):
            raise ModelFailure(f"tool_calls is not a list: {calls!r:.200}")
        kept: dict[str, Any] = {"role": "assistant", "content": message.get("content")}
        if calls:
            kept["tool_calls"] = calls
        self.messages.append(kept)
        return kept

    def tell(self, reason: str, call_id: str | None = None) -> None:
        """A format error, told to the model (a tool message for a call, else a user one)."""
        self.format_errors += 1
        text = f"Error: {reason}. Call one of the offered tools; finish with `{FINAL_ANSWER}`."
        if call_id is None:
            self.messages.append({"role": "user", "content": text})
        else:
            self.messages.append({"role": "tool", "tool_call_id": call_id, "content": text})

    async def act(self, message: dict[str, Any]) -> str | None:
        """Run the message's calls; the answer when the model gave one."""
        calls = message.get("tool_calls") or []
        if not calls:
            text = message.get("content")
            if isinstance(text, str) and text.strip():
                return text.strip()
            self.tell("the reply was empty")
            return None
        answer: str | None = None
        for call in calls:
            call_id, name, arguments = parse_call(call)
            if answer is not None:
                self.reply(call_id, "not run: the task is already answered")
                continue
            if name not in self.names:
                self.tell(f"there is no tool {str(name)[:80]!r}", call_id)
                continue
            self.tool_calls += 1
            if name == FINAL_ANSWER:
                given = _argument(arguments, "answer")
                if isinstance(given, _Bad):
                    self.tell(given.reason, call_id)
                    continue
                answer = given
                self.reply(call_id, "ok")
            elif name == BASH:
                command = _argument(arguments, "command")
                if isinstance(command, _Bad):
                    self.tell(command.reason, call_id)
                    continue
                self.reply(call_id, await self.bash(command))
            else:
                assert self.services is not None
                self.reply(call_id, await self.services.call_tool(str(name), arguments))
        return answer

    def reply(self, call_id: str, content: str) -> None:
        self.messages.append({"role": "tool", "tool_call_id": call_id, "content": content})

    async def bash(self, command: str) -> str:
        timeout = min(self.limits.command_timeout, max(1.0, self.deadline - time.monotonic()))
        done = await self.sandbox.exec(
            ["bash", "-c", "exec 2>&1\n" + command],
            cwd=self.task.environment.workdir,
            timeout=timeout,
        )
        limits = self.limits
        text = truncate(
            done.stdout + done.stderr, limits.output_head_bytes, limits.output_tail_bytes
        )
        note = f" (timed out after {timeout:.0f} s)" if done.timed_out else ""
        return f"exit {done.exit_code}{note}\n{text}"


def _argument(arguments: Any, key: str) -> str | _Bad:
    """The string argument ``key`` of a call's JSON arguments."""
    try:
        parsed = json.loads(arguments) if isinstance(arguments, str) else arguments
    except ValueError:
        return _Bad(f"the arguments are not valid JSON: {str(arguments)[:200]!r}")
    value = parsed.get(key) if isinstance(parsed, dict) else None
    if not isinstance(value, str):
        return _Bad(f'the arguments have no "{key}" string')
    return value
