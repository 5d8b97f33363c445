"""The built-in bash agent: a mini-swe-agent-style loop as a :class:`orchard.rollouts.Harness`.

It runs in the driver's process: the model is called over the rollout's proxy session
(``ModelEndpoint.openai_base_url``, OpenAI Chat with one function tool, ``bash``) and each
command runs in the rollout's sandbox through ``AsyncSandbox.exec`` as a fresh
``bash -c`` in the task's workdir, stderr merged into stdout. The loop stops when:

- a command's output starts with the sentinel line (``echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT``,
  :data:`~orchard.recipes.swe.prompts.SENTINEL`): ``COMPLETED``;
- a limit is hit (``Limits.max_steps`` model calls, ``max_seconds`` of wall time,
  ``max_tokens`` of context as the endpoint's ``usage.total_tokens`` of the last call, or
  ``max_format_errors``): ``TRUNCATED`` (a task outcome: graded);
- the model endpoint fails (unreachable, an error status after the retries, an answer that is
  not a Chat completion) or the sandbox does (any SDK error from ``exec``): ``ABORTED``, with
  ``fault`` saying what failed; never a reward.

A reply without a tool call, a call to another tool, or arguments that are not a JSON object
with a string ``command`` is a *format error*: the model is told what was wrong (a tool
message for a bad call, a user message for no call) and the error is counted
(``detail["format_errors"]``). Each command's output is cut to its first
``Limits.output_head_bytes`` and last ``output_tail_bytes`` with a marker saying how much was
left out. A command that times out is an observation (``<note>``), not a failure.

Why our own loop and not mini-swe-agent's ``DefaultAgent``: the loop must run hundreds of
rollouts from one asyncio process against the SDK's async sandboxes with a tiny per-step
overhead. So the history is kept JSON-encoded, one piece per message (a step encodes only
its new messages; the request body is a join of bytes), one ``aiohttp.ClientSession`` (its
connection pool; aiohttp is what ``orchard.rollouts``' proxy client uses too) serves every
rollout of the harness, and the answer is read as plain JSON.
mini-swe-agent itself runs as a real harness through the tools layer (``--harness``).
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

import orchard
from orchard.rollouts import HarnessRun, Limits, ModelEndpoint, Status, Task

from . import prompts

if TYPE_CHECKING:
    from orchard import AsyncSandbox

RETRY_STATUSES = frozenset({429, 502, 503, 504})
MAX_COMMAND_BYTES = 256 * 1024


class ModelFailure(Exception):
    """The model endpoint failed (infrastructure: the rollout is ABORTED)."""


class WallTimeUp(Exception):
    """The rollout's wall time ran out while waiting for the model (TRUNCATED)."""


@dataclass(frozen=True)
class AgentConfig:
    """How the bash agent talks to the model; ``Limits`` (per rollout) say when it stops."""

    system_prompt: str = prompts.SYSTEM_PROMPT
    instance_template: str = prompts.INSTANCE_TEMPLATE
    """Formatted with ``problem`` (the task's prompt) and ``workdir``."""
    max_format_errors: int = 5
    """Format errors (over the whole rollout) before it is TRUNCATED."""
    model_retries: int = 2
    """Retries of a call that failed to connect or answered 429/502/503/504 (the same body:
    the recording proxy counts it as a retry of the same call)."""
    retry_backoff_seconds: float = 0.5
    request_timeout: float = 600.0
    """One model call's limit; a call still running at the rollout's wall-time end stops it."""
    sampling: Mapping[str, Any] = field(default_factory=dict)
    """Extra Chat body fields (``temperature``, ``max_tokens``, ``top_p``, ...)."""
    echo_reasoning: bool = False
    """Send a reply's ``reasoning_content`` back in the history (for a chat template that
    renders it; most drop it, and some endpoints refuse the field)."""


@dataclass
class _Steps:
    """The per-step timings: what the model call, the commands and the loop itself took."""

    model: list[float] = field(default_factory=list)
    exec: list[float] = field(default_factory=list)
    overhead: list[float] = field(default_factory=list)

    def as_dict(self) -> dict[str, list[float]]:
        return {"model_s": self.model, "exec_s": self.exec, "overhead_s": self.overhead}


def truncate(data: bytes, head: int, tail: int) -> str:
    """``data`` as text, cut to its first ``head`` and last ``tail`` bytes with a marker."""
    if len(data) <= head + tail:
        return data.decode("utf-8", errors="replace")
    left = len(data) - head - tail
    return (
        data[:head].decode("utf-8", errors="replace")
        + f"\n<output truncated: {left} bytes left out of {len(data)}; "
        f"the first {head} and the last {tail} are shown>\n"
        + data[len(data) - tail :].decode("utf-8", errors="replace")
    )


def submitted(output: bytes) -> bool:
    """The sentinel: the output's first non-blank line is exactly the sentinel."""
    first = output.lstrip().split(b"\n", 1)[0]
    return first.strip() == prompts.SENTINEL.encode()


def parse_call(call: Any) -> tuple[str, Any, Any]:
    """(id, function name, arguments) of a tool call; a call without an id or function is an
    answer that is not a Chat completion (the endpoint's fault, not the model's)."""
    if not isinstance(call, dict):
        raise ModelFailure(f"a tool call is not an object: {call!r:.200}")
    call_id = call.get("id")
    function = call.get("function")
    if not isinstance(call_id, str) or not isinstance(function, dict):
        raise ModelFailure(f"a tool call has no id or function: {call!r:.200}")
    return call_id, function.get("name"), function.get("arguments")


class BashAgent:
    """The built-in harness: ``BashAgent(config).run(sandbox, task, model, limits)``.

    One instance serves many concurrent rollouts (its HTTP client is shared); ``aclose()``
    when done (or ``async with``).
    """

    name = "bash"
    needs_tools_layer = False

    def __init__(
        self, config: AgentConfig | None = None, *, ca: str | ssl.SSLContext | None = None
    ) -> None:
        self.config = config or AgentConfig()
        if isinstance(ca, str):
            ca = ssl.create_default_context(cafile=ca)
        self._ssl: ssl.SSLContext | bool = ca if ca is not None else True
        """``ca``: what an HTTPS proxy is trusted by (``orchard up --tls``: ``run/ca.pem``)."""
        self._http: aiohttp.ClientSession | None = None
        self._tool = json.dumps([prompts.TOOL]).encode()

    def _client(self) -> aiohttp.ClientSession:
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

    async def __aenter__(self) -> BashAgent:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def run(
        self, sandbox: AsyncSandbox, task: Task, model: ModelEndpoint, limits: Limits
    ) -> HarnessRun:
        return await _Rollout(self, sandbox, task, model, limits).run()


class _Rollout:
    """One rollout's state: the history (decoded and encoded), counters, timings."""

    def __init__(
        self,
        agent: BashAgent,
        sandbox: AsyncSandbox,
        task: Task,
        model: ModelEndpoint,
        limits: Limits,
    ) -> None:
        self.agent = agent
        self.config = agent.config
        self.sandbox = sandbox
        self.task = task
        self.limits = limits
        self.url = model.openai_base_url.rstrip("/") + "/chat/completions"
        head = {"model": model.model, **self.config.sampling}
        # the body without its messages: '{"model": ..., "tools": [...], "messages": [' + ... + ']}'
        self.body_head = json.dumps(head)[:-1].encode() + b', "tools": ' + agent._tool
        self.body_head += b', "messages": ['
        self.messages: list[dict[str, Any]] = []
        self.encoded: list[bytes] = []
        self.steps = 0
        self.format_errors = 0
        self.context_tokens: int | None = None
        self.completion_tokens = 0
        self.timing = _Steps()
        self.started = time.monotonic()
        self.deadline = self.started + limits.max_seconds
        self.exec_cap = max(1 << 20, 8 * (limits.output_head_bytes + limits.output_tail_bytes))

    def add(self, message: dict[str, Any]) -> None:
        self.messages.append(message)
        self.encoded.append(json.dumps(message).encode())

    def end(
        self, status: Status, reason: str, fault: str | None = None, submission: str | None = None
    ) -> HarnessRun:
        detail = {
            "stop_reason": reason,
            "format_errors": self.format_errors,
            "context_tokens": self.context_tokens,
            "completion_tokens": self.completion_tokens,
            "seconds": time.monotonic() - self.started,
            "timing": self.timing.as_dict(),
        }
        return HarnessRun(status, self.steps, submission, self.messages, fault, detail)

    async def run(self) -> HarnessRun:
        workdir = self.task.workdir or "/"
        self.add({"role": "system", "content": self.config.system_prompt})
        self.add(
            {
                "role": "user",
                "content": self.config.instance_template.format(
                    problem=self.task.prompt, workdir=workdir
                ),
            }
        )
        limits = self.limits
        while True:
            if self.steps >= limits.max_steps:
                return self.end(Status.TRUNCATED, "max_steps")
            if time.monotonic() >= self.deadline:
                return self.end(Status.TRUNCATED, "max_seconds")
            if (
                limits.max_tokens is not None
                and self.context_tokens is not None
                and self.context_tokens >= limits.max_tokens
            ):
                return self.end(Status.TRUNCATED, "max_tokens")
            if self.format_errors >= self.config.max_format_errors:
                return self.end(Status.TRUNCATED, "format_errors")
            step_start = time.perf_counter()
            try:
                model_s, message = await self.complete()
            except WallTimeUp:
                return self.end(Status.TRUNCATED, "max_seconds")
            except ModelFailure as err:
                return self.end(Status.ABORTED, "model_failed", f"model endpoint: {err}")
            self.steps += 1
            try:
                exec_s, done = await self.act(message, workdir)
            except ModelFailure as err:
                return self.end(Status.ABORTED, "model_failed", f"model endpoint: {err}")
            except orchard.OrchardError as err:
                fault = f"sandbox: {type(err).__name__}: {err}"
                return self.end(Status.ABORTED, "sandbox_failed", fault)
            total = time.perf_counter() - step_start
            self.timing.model.append(model_s)
            self.timing.exec.append(exec_s)
            self.timing.overhead.append(max(0.0, total - model_s - exec_s))
            if done is not None:
                return self.end(Status.COMPLETED, "submitted", submission=done)

    async def complete(self) -> tuple[float, dict[str, Any]]:
        """One model call: (seconds spent waiting, the assistant message, added to history)."""
        body = self.body_head + b",".join(self.encoded) + b"]}"
        http = self.agent._client()
        waited = 0.0
        attempt = 0
        while True:
            remaining = self.deadline - time.monotonic()
            if remaining <= 0:
                raise WallTimeUp
            timeout = min(self.config.request_timeout, remaining)
            t0 = time.perf_counter()
            try:
                async with http.post(
                    self.url, data=body, timeout=aiohttp.ClientTimeout(total=timeout)
                ) as response:
                    status = response.status
                    content = await response.read()
            except TimeoutError as err:
                waited += time.perf_counter() - t0
                if timeout < self.config.request_timeout:
                    raise WallTimeUp from err
                raise ModelFailure(f"no answer within {timeout:.0f} s") from err
            except aiohttp.ClientError as err:
                waited += time.perf_counter() - t0
                if attempt >= self.config.model_retries:
                    raise ModelFailure(f"unreachable: {type(err).__name__}: {err}") from err
            else:
                waited += time.perf_counter() - t0
                if status == 200:
                    break
                if status not in RETRY_STATUSES or attempt >= self.config.model_retries:
                    raise ModelFailure(f"answered {status}: {content[:500]!r}")
            attempt += 1
            pause = self.config.retry_backoff_seconds * (2 ** (attempt - 1))
            await asyncio.sleep(pause)
            waited += pause
        return waited, self.read_answer(content)

    def read_answer(self, content: bytes) -> dict[str, Any]:
        try:
            answer = json.loads(content)
            message = answer["choices"][0]["message"]
        except (ValueError, KeyError, IndexError, TypeError) as err:
            raise ModelFailure(f"not a Chat completion: {content[:300]!r}") from err
        if not isinstance(message, dict):
            raise ModelFailure(f"the choice's message is not an object: {message!r:.200}")
        usage = answer.get("usage")
        if isinstance(usage, dict):
            total = usage.get("total_tokens")
            if isinstance(total, int):
                self.context_tokens = total
            completion = usage.get("completion_tokens")
            if isinstance(completion, int):
                self.completion_tokens += completion
        kept: dict[str, Any] = {"role": "assistant", "content": message.get("content")}
        if self.config.echo_reasoning and message.get("reasoning_content"):
            kept["reasoning_content"] = message["reasoning_content"]
        calls = message.get("tool_calls")
        if calls is not None and not isinstance(calls, list):
            raise ModelFailure(f"tool_calls is not a list: {calls!r:.200}")
        if calls:
            kept["tool_calls"] = calls
        self.add(kept)
        return kept

    def format_error(self, reason: str, call_id: str | None = None) -> None:
        self.format_errors += 1
        text = prompts.FORMAT_ERROR.format(reason=reason)
        if call_id is None:
            self.add({"role": "user", "content": text})
        else:
            self.add({"role": "tool", "tool_call_id": call_id, "content": text})

    async def act(self, message: dict[str, Any], workdir: str) -> tuple[float, str | None]:
        """Run the message's tool calls: (seconds in exec, the submission if one submitted)."""
        calls = message.get("tool_calls") or []
        if not calls:
            self.format_error("the reply called no tool")
            return 0.0, None
        exec_s = 0.0
        submission: str | None = None
        for call in calls:
            call_id, name, arguments = parse_call(call)
            if submission is not None:
                self.add({"role": "tool", "tool_call_id": call_id, "content": "not run: submitted"})
                continue
            if time.monotonic() >= self.deadline:  # the main loop stops the rollout next
                self.add(
                    {"role": "tool", "tool_call_id": call_id, "content": "not run: time is up"}
                )
                continue
            command = self.command_of(name, arguments)
            if isinstance(command, BadCall):
                self.format_error(command.reason, call_id)
                continue
            t0 = time.perf_counter()
            text, output = await self.execute(command, workdir)
            exec_s += time.perf_counter() - t0
            if submitted(output):
                rest = output.lstrip().split(b"\n", 1)
                submission = rest[1].decode("utf-8", "replace") if len(rest) > 1 else ""
            self.add({"role": "tool", "tool_call_id": call_id, "content": text})
        return exec_s, submission

    def command_of(self, name: Any, arguments: Any) -> str | BadCall:
        if name != "bash":
            return BadCall(f"there is no tool {str(name)[:80]!r}, only `bash`")
        if not isinstance(arguments, str):
            return BadCall("the arguments are not a JSON string")
        try:
            parsed = json.loads(arguments)
        except ValueError:
            return BadCall(f"the arguments are not valid JSON: {arguments[:200]!r}")
        command = parsed.get("command") if isinstance(parsed, dict) else None
        if not isinstance(command, str) or not command.strip():
            return BadCall('the arguments have no "command" string')
        if "\x00" in command:
            return BadCall("the command contains a NUL byte")
        if len(command.encode()) > MAX_COMMAND_BYTES:
            return BadCall(f"the command is over {MAX_COMMAND_BYTES} bytes")
        return command

    async def execute(self, command: str, workdir: str) -> tuple[str, bytes]:
        """Run one command; (the observation, the raw merged output)."""
        limits = self.limits
        remaining = max(1.0, self.deadline - time.monotonic())
        timeout = min(limits.command_timeout, remaining)
        result = await self.sandbox.exec(
            ["bash", "-c", "exec 2>&1\n" + command],
            timeout=timeout,
            cwd=workdir,
            env=dict(self.task.env) or None,
            max_output_bytes=self.exec_cap,
        )
        output = result.stdout + result.stderr
        notes = []
        if result.timed_out:
            notes.append(f"the command timed out after {timeout:.0f} s and was killed")
        if result.status.oom_killed:
            notes.append("the command ran out of memory and was killed")
        if result.status.truncated:
            notes.append(f"the output passed {self.exec_cap} bytes; the rest was dropped")
        text = truncate(output, limits.output_head_bytes, limits.output_tail_bytes)
        return prompts.observation(result.exit_code, text, "; ".join(notes)), output


@dataclass(frozen=True)
class BadCall:
    reason: str
