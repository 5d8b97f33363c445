"""Claude Code (npm ``@anthropic-ai/claude-code``): ``claude -p`` against the session's proxy.

Wire format: Anthropic **Messages** (``ANTHROPIC_BASE_URL`` = the session's
``anthropic_base_url_in_sandbox``; the key is a placeholder, the credential is in the
path). Every model role (main, small/fast, haiku) is the session's model, so no call asks
for a model the proxy does not serve. Non-essential traffic, telemetry, error reporting
and the auto-updater are off, extended thinking is off (a Chat upstream cannot carry
it); ``--bare`` skips hooks, plugins, keychain reads and
background prefetches. Permission prompts are bypassed (``IS_SANDBOX=1`` lets root do
that): the Orchard sandbox is the boundary.

Limits: ``--max-turns`` = ``Limits.max_steps``; the wall time is the run's timeout.

Transcript: ``--output-format stream-json --verbose`` prints one JSON message a line
(system init, assistant and user turns, a final ``result``); that list is returned, with
the result text as the submission. ``steps`` counts distinct assistant message ids
(model calls). Result ``success`` is COMPLETED, ``error_max_turns`` TRUNCATED, an error
result that names the API (connection, HTTP status) ABORTED.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .._types import HarnessRun, Limits, ModelEndpoint, Status, Task
from ._cli import PLACEHOLDER_KEY, RUN_DIR, CliHarness, json_lines

if TYPE_CHECKING:
    from orchard import AsyncSandbox, ExecResult


class ClaudeCode(CliHarness):
    name = "claude-code"
    command = "claude"
    wire_format = "messages"

    def env(self, task: Task, model: ModelEndpoint, limits: Limits) -> dict[str, str]:
        return {
            "ANTHROPIC_BASE_URL": model.anthropic_base_url_in_sandbox,
            "ANTHROPIC_API_KEY": PLACEHOLDER_KEY,
            "ANTHROPIC_MODEL": model.model,
            "ANTHROPIC_SMALL_FAST_MODEL": model.model,
            "ANTHROPIC_DEFAULT_HAIKU_MODEL": model.model,
            "ANTHROPIC_DEFAULT_SONNET_MODEL": model.model,
            "ANTHROPIC_DEFAULT_OPUS_MODEL": model.model,
            "CLAUDE_CONFIG_DIR": f"{RUN_DIR}/claude",
            "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
            "DISABLE_TELEMETRY": "1",
            "DISABLE_ERROR_REPORTING": "1",
            "DISABLE_AUTOUPDATER": "1",
            "CLAUDE_CODE_MAX_RETRIES": "0",
            "IS_SANDBOX": "1",
            # Extended thinking is a Messages setting a Chat upstream cannot carry.
            "CLAUDE_CODE_DISABLE_THINKING": "1",
            "CLAUDE_CODE_DISABLE_ADAPTIVE_THINKING": "1",
            "MAX_THINKING_TOKENS": "0",
        }

    def argv(self, task: Task, model: ModelEndpoint, limits: Limits) -> list[str]:
        return [
            self.executable,
            "--print",
            "--bare",
            "--output-format",
            "stream-json",
            "--verbose",
            "--model",
            model.model,
            "--max-turns",
            str(limits.max_steps),
            "--dangerously-skip-permissions",
            task.prompt,
        ]

    async def outcome(
        self, sandbox: AsyncSandbox, result: ExecResult, task: Task, limits: Limits
    ) -> HarnessRun:
        messages = [m for m in json_lines(result.stdout_text) if isinstance(m, dict)]
        if not messages:
            raise FileNotFoundError("claude printed no stream-json messages")
        ids: set[str] = set()
        for m in messages:
            inner = m.get("message")
            if m.get("type") == "assistant" and isinstance(inner, dict):
                ids.add(str(inner.get("id") or len(ids)))
        final: dict[str, Any] = next(
            (m for m in reversed(messages) if m.get("type") == "result"), {}
        )
        subtype = str(final.get("subtype") or "")
        text = final.get("result")
        submission = text if isinstance(text, str) else None
        detail = {"result_subtype": subtype, "num_turns": final.get("num_turns")}
        if subtype == "success" and not final.get("is_error"):
            status, fault = Status.COMPLETED, None
        elif subtype == "error_max_turns":
            status, fault = Status.TRUNCATED, "claude-code: stopped at --max-turns"
        elif final and not final.get("is_error"):
            status, fault = Status.COMPLETED, None
        else:
            status = Status.ABORTED
            fault = f"claude-code: {subtype or 'no result'}: {str(text or '')[:1500]}"
        return HarnessRun(
            status=status,
            steps=len(ids),
            submission=submission,
            transcript=messages,
            fault=fault,
            detail=detail,
        )
