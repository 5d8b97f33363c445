"""The real agent harness CLIs of the tools layer, as :class:`orchard.rollouts.Harness`.

Each runs inside the rollout's sandbox (created with ``tools=True``: the layer at
``/opt/orchard/tools``) and talks only to the session's proxy URL:

=================  ===============  ==========================================
class              CLI              model API (wire format)
=================  ===============  ==========================================
``Codex``          ``codex exec``   OpenAI Responses
``ClaudeCode``     ``claude -p``    Anthropic Messages
``OpenClaw``       ``openclaw``     OpenAI Chat Completions
``MiniSweAgent``   ``mini``         OpenAI Chat Completions (LiteLLM)
``Aider``          ``aider``        OpenAI Chat Completions (LiteLLM)
=================  ===============  ==========================================

``HARNESSES`` maps each ``name`` to its class. ``Codex`` and ``OpenClaw`` also take
``mcp_servers={name: McpServer(url=...)}`` (or ``command=``): MCP servers written into their
own config, so the model is offered their tools. See docs/tools-layer.md.
"""

from __future__ import annotations

from ._cli import BIN, TOOLS, CliHarness, McpServer
from .aider import Aider
from .claude_code import ClaudeCode
from .codex import Codex
from .mini_swe_agent import MiniSweAgent
from .openclaw import OpenClaw

HARNESSES: dict[str, type[CliHarness]] = {
    cls.name: cls for cls in (Codex, ClaudeCode, OpenClaw, MiniSweAgent, Aider)
}

__all__ = [
    "BIN",
    "HARNESSES",
    "TOOLS",
    "Aider",
    "ClaudeCode",
    "CliHarness",
    "Codex",
    "McpServer",
    "MiniSweAgent",
    "OpenClaw",
]
