"""OpenClaw (npm ``openclaw``): ``openclaw agent exec``, its headless one-task entry point.

Wire format: OpenAI **Chat** Completions (provider ``api: "openai-completions"``). The run
is pinned to a config file of ours (``--config``): one provider, ``orchard``, whose
``baseUrl`` is the session's ``openai_base_url_in_sandbox``, the catalog replaced (no
discovery of other providers), and private-network access allowed for that exact origin
(the proxy is reached on a node-local address). No Gateway is started; the agent's own
sandbox is off (the Orchard sandbox is the boundary), its tools are scoped to ``--cwd``.

MCP: ``mcp_servers`` go into the config's ``mcp.servers`` (``url`` with ``transport:
"streamable-http"``, or ``command``/``args``), which OpenClaw's embedded agent connects to
and offers as tools.

Limits: ``--timeout`` = ``Limits.max_seconds`` (OpenClaw exits 2 on it: TRUNCATED); it has
no step limit of its own.

Transcript: the ``--json`` envelope (``status``, ``final``, ``assistantTurns``,
``toolSummary``, ``usage``, ``error``) with the retained state folder's path (its session
store); ``steps`` = ``assistantTurns``. Status ``ok`` is COMPLETED, ``timeout``
TRUNCATED, ``error`` ABORTED when it is the model endpoint's (``error.kind``), else
COMPLETED with the error kept in ``detail``.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from .._types import HarnessRun, Limits, ModelEndpoint, Status, Task
from ._cli import PLACEHOLDER_KEY, RUN_DIR, CliHarness, McpServer, json_lines

if TYPE_CHECKING:
    from orchard import AsyncSandbox, ExecResult

CONFIG = f"{RUN_DIR}/openclaw.json"
STATE = f"{RUN_DIR}/openclaw-state"
PROMPT = f"{RUN_DIR}/openclaw-task.md"
_MODEL_ERROR_KINDS = ("model", "provider", "network", "auth", "http", "fallback")


def _mcp_entry(server: McpServer) -> dict[str, Any]:
    """One ``mcp.servers`` entry of OpenClaw's config."""
    entry: dict[str, Any]
    if server.url is not None:
        entry = {"url": server.url, "transport": "streamable-http"}
    else:
        entry = {"command": server.command[0], "args": list(server.command[1:])}
    if server.env:
        entry["env"] = dict(server.env)
    return {**entry, "connectionTimeoutMs": 60_000, "requestTimeoutMs": 120_000}


class OpenClaw(CliHarness):
    name = "openclaw"
    command = "openclaw"
    wire_format = "chat"
    supports_mcp = True

    def files(self, task: Task, model: ModelEndpoint, limits: Limits) -> dict[str, str]:
        config: dict[str, Any] = {
            "models": {
                "mode": "replace",
                "providers": {
                    "orchard": {
                        "baseUrl": model.openai_base_url_in_sandbox,
                        "apiKey": PLACEHOLDER_KEY,
                        "api": "openai-completions",
                        "timeoutSeconds": int(limits.max_seconds),
                        "request": {"allowPrivateNetwork": True},
                        "models": [
                            {
                                "id": model.model,
                                "name": model.model,
                                "reasoning": False,
                                "input": ["text"],
                                "cost": {"input": 0, "output": 0, "cacheRead": 0, "cacheWrite": 0},
                                "contextWindow": 32768,
                                "maxTokens": 4096,
                            }
                        ],
                    }
                },
            },
            "agents": {"defaults": {"model": {"primary": f"orchard/{model.model}"}}},
        }
        if self.mcp_servers:
            config["mcp"] = {
                "servers": {name: _mcp_entry(s) for name, s in self.mcp_servers.items()}
            }
        return {CONFIG: json.dumps(config, indent=2), PROMPT: task.prompt}

    def env(self, task: Task, model: ModelEndpoint, limits: Limits) -> dict[str, str]:
        return {
            "OPENCLAW_STATE_DIR": STATE,
            "OPENCLAW_CONFIG_PATH": CONFIG,
            "OPENCLAW_AGENT_DIR": f"{STATE}/agent",
            "OPENCLAW_NO_AUTO_UPDATE": "1",
        }

    def argv(self, task: Task, model: ModelEndpoint, limits: Limits) -> list[str]:
        return [
            "sh",
            "-c",
            f'mkdir -p "{STATE}" && exec "$0" "$@"',
            self.executable,
            "agent",
            "exec",
            "--config",
            CONFIG,
            "--state-dir",
            STATE,
            "--model",
            f"orchard/{model.model}",
            "--cwd",
            task.workdir,
            "--timeout",
            str(int(limits.max_seconds)),
            "--json",
            "--message-file",
            PROMPT,
        ]

    async def outcome(
        self, sandbox: AsyncSandbox, result: ExecResult, task: Task, limits: Limits
    ) -> HarnessRun:
        envelopes = [v for v in json_lines(result.stdout_text) if isinstance(v, dict)]
        if not envelopes:
            try:
                envelopes = [json.loads(result.stdout_text)]
            except ValueError:
                raise FileNotFoundError("openclaw printed no JSON envelope") from None
        envelope = envelopes[-1]
        status_text = str(envelope.get("status") or "")
        steps = int(envelope.get("assistantTurns") or 0)
        final = envelope.get("final")
        submission = final if isinstance(final, str) else None
        error = envelope.get("error") if isinstance(envelope.get("error"), dict) else None
        transcript = {"envelope": envelope, "state_dir": STATE}
        if status_text == "ok":
            status, fault = Status.COMPLETED, None
        elif status_text == "timeout":
            status, fault = Status.TRUNCATED, "openclaw: stopped at its --timeout"
        else:
            kind = str((error or {}).get("kind") or "").lower()
            message = str((error or {}).get("message") or "")[:1500]
            if any(k in kind for k in _MODEL_ERROR_KINDS) or steps == 0:
                status, fault = Status.ABORTED, f"openclaw: {kind or 'error'}: {message}"
            else:
                status, fault = Status.COMPLETED, None
        return HarnessRun(
            status=status,
            steps=steps,
            submission=submission,
            transcript=transcript,
            fault=fault,
            detail={"openclaw_status": status_text, "error": error},
        )
