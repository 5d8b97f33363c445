"""OpenAI Codex CLI (npm ``@openai/codex``): ``codex exec`` against the session's proxy.

Wire format: **Responses** only (Codex has no Chat client). Configuration goes into its own
``$CODEX_HOME/config.toml`` under the run folder: one model provider, ``orchard``, whose
``base_url`` is the session's ``openai_base_url_in_sandbox`` (the credential is in the
path; the key Codex insists on is a placeholder), retries off so a failing endpoint shows
as a failure instead of minutes of retries, update checks and analytics off, and only
function tools offered (web search, sub-agents and goals off: a Chat upstream has no such
tools). Codex's own
OS sandbox is off (``--dangerously-bypass-approvals-and-sandbox``): the Orchard sandbox is
the boundary, and Codex's landlock/seccomp sandbox needs privileges a container lacks.

MCP: each of ``mcp_servers`` becomes a ``[mcp_servers.<name>]`` table of that config
(``url`` for streamable HTTP, ``command``/``args`` for stdio); Codex offers each server's tools
to the model as one Responses tool of type ``namespace`` (``mcp__<name>``) beside its own, which
the proxy flattens onto Chat functions ``mcp__<name>__<tool>`` and maps back
(docs/modelproxy.md).

Transcript: ``codex exec --json`` prints one JSON event a line (thread, turns, items:
commands run, file changes, agent messages); that list is returned, with the last agent
message (``--output-last-message``) as the submission. ``steps`` counts the completed
items that came from the model (commands, file changes, messages). Codex has no step
limit of its own: the time limit stops it (the proxy session can cap calls too).
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from .._types import HarnessRun, Limits, ModelEndpoint, Status, Task
from ._cli import PLACEHOLDER_KEY, RUN_DIR, CliHarness, json_lines

if TYPE_CHECKING:
    from orchard import AsyncSandbox, ExecResult

CODEX_HOME = f"{RUN_DIR}/codex"
LAST_MESSAGE = f"{RUN_DIR}/codex-last-message.txt"
KEY_ENV = "CODEX_PROXY_KEY"


def _toml(value: str) -> str:
    return json.dumps(value)  # a JSON string is a valid TOML basic string


class Codex(CliHarness):
    name = "codex"
    command = "codex"
    wire_format = "responses"
    supports_mcp = True

    def files(self, task: Task, model: ModelEndpoint, limits: Limits) -> dict[str, str]:
        config = "\n".join(
            [
                f"model = {_toml(model.model)}",
                'model_provider = "orchard"',
                'approval_policy = "never"',
                'sandbox_mode = "danger-full-access"',
                "check_for_update_on_startup = false",
                # No web search (a tool type a Chat upstream cannot carry: the proxy refuses
                # it by name) and no sub-agent namespace (untried through the proxy).
                'web_search = "disabled"',
                "",
                "[features]",
                "multi_agent = false",
                "goals = false",
                "",
                "[model_providers.orchard]",
                'name = "orchard"',
                f"base_url = {_toml(model.openai_base_url_in_sandbox)}",
                f'env_key = "{KEY_ENV}"',
                'wire_api = "responses"',
                "request_max_retries = 0",
                "stream_max_retries = 0",
                "",
                "[analytics]",
                "enabled = false",
                "",
                f"[projects.{_toml(task.workdir)}]",
                'trust_level = "trusted"',
                "",
                *self._mcp_config(),
            ]
        )
        return {f"{CODEX_HOME}/config.toml": config}

    def _mcp_config(self) -> list[str]:
        """``[mcp_servers.<name>]`` tables: ``url`` (streamable HTTP) or ``command`` + ``args``."""
        lines: list[str] = []
        for name, server in self.mcp_servers.items():
            lines.append(f"[mcp_servers.{name}]")
            if server.url is not None:
                lines.append(f"url = {_toml(server.url)}")
            else:
                lines.append(f"command = {_toml(server.command[0])}")
                lines.append(f"args = [{', '.join(_toml(a) for a in server.command[1:])}]")
            lines.append("startup_timeout_sec = 60")
            lines.append("tool_timeout_sec = 120")
            if server.env:
                lines.append(f"[mcp_servers.{name}.env]")
                lines.extend(f"{_toml(k)} = {_toml(v)}" for k, v in server.env.items())
            lines.append("")
        return lines

    def env(self, task: Task, model: ModelEndpoint, limits: Limits) -> dict[str, str]:
        return {"CODEX_HOME": CODEX_HOME, KEY_ENV: PLACEHOLDER_KEY, "RUST_LOG": "error"}

    def argv(self, task: Task, model: ModelEndpoint, limits: Limits) -> list[str]:
        return [
            self.executable,
            "exec",
            "--json",
            "--skip-git-repo-check",
            "--dangerously-bypass-approvals-and-sandbox",
            "--cd",
            task.workdir,
            "--model",
            model.model,
            "--output-last-message",
            LAST_MESSAGE,
            task.prompt,
        ]

    async def outcome(
        self, sandbox: AsyncSandbox, result: ExecResult, task: Task, limits: Limits
    ) -> HarnessRun:
        events = json_lines(result.stdout_text)
        if not events:
            raise FileNotFoundError("codex printed no JSON events")
        steps = sum(
            1
            for e in events
            if isinstance(e, dict)
            and e.get("type") == "item.completed"
            and isinstance(e.get("item"), dict)
            and e["item"].get("type") in ("command_execution", "file_change", "agent_message")
        )
        errors = [
            e for e in events if isinstance(e, dict) and e.get("type") in ("error", "turn.failed")
        ]
        try:
            submission: str | None = await self.read_text(sandbox, LAST_MESSAGE)
        except FileNotFoundError:
            submission = None
        if errors and result.exit_code != 0:
            return HarnessRun(
                status=Status.ABORTED,
                steps=steps,
                transcript=events,
                submission=submission,
                fault=f"codex: {json.dumps(errors[-1])[:1500]}",
            )
        return HarnessRun(
            status=Status.COMPLETED, steps=steps, transcript=events, submission=submission
        )
