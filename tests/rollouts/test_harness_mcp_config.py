"""The ``mcp_servers`` option of the tools-layer adapters (no sandbox): what Codex's
config.toml and OpenClaw's config file say for a URL server and a stdio server, and the
refusals (a bad name, a server with both or neither of url and command, an adapter that
does not configure MCP)."""

from __future__ import annotations

import json
import tomllib

import pytest

from orchard.rollouts import Limits, ModelEndpoint, Task
from orchard.rollouts.harnesses import ClaudeCode, Codex, McpServer, OpenClaw

MODEL = ModelEndpoint("s", "m", "http://h/v1", "http://h", "http://127.0.0.1:7711/s/c/v1", "x")
TASK = Task(id="t", prompt="p", workdir="/workspace")
SERVERS = {
    "claw": McpServer(url="http://127.0.0.1:7791/mcp"),
    "local": McpServer(command=("python3", "-I", "/opt/x.py", "--base", "http://127.0.0.1:1"),
                       env={"A": "b"}),
}  # fmt: skip


def test_codex_writes_mcp_servers_tables() -> None:
    (text,) = Codex(mcp_servers=SERVERS).files(TASK, MODEL, Limits()).values()
    config = tomllib.loads(text)
    assert config["mcp_servers"]["claw"]["url"] == "http://127.0.0.1:7791/mcp"
    local = config["mcp_servers"]["local"]
    assert local["command"] == "python3"
    assert local["args"] == ["-I", "/opt/x.py", "--base", "http://127.0.0.1:1"]
    assert local["env"] == {"A": "b"}
    assert config["model_providers"]["orchard"]["base_url"] == MODEL.openai_base_url_in_sandbox
    assert "mcp_servers" not in tomllib.loads(
        next(iter(Codex().files(TASK, MODEL, Limits()).values()))
    )


def test_openclaw_writes_mcp_servers() -> None:
    files = OpenClaw(mcp_servers=SERVERS).files(TASK, MODEL, Limits())
    config = json.loads(next(text for path, text in files.items() if path.endswith(".json")))
    servers = config["mcp"]["servers"]
    assert servers["claw"]["url"] == "http://127.0.0.1:7791/mcp"
    assert servers["claw"]["transport"] == "streamable-http"
    assert servers["local"]["command"] == "python3" and servers["local"]["env"] == {"A": "b"}


def test_bad_mcp_servers_are_refused() -> None:
    with pytest.raises(ValueError, match="exactly one"):
        McpServer()
    with pytest.raises(ValueError, match="exactly one"):
        McpServer(url="http://x/mcp", command=("a",))
    with pytest.raises(ValueError, match="not an http"):
        McpServer(url="file:///etc/passwd")
    with pytest.raises(ValueError, match="letters, digits"):
        Codex(mcp_servers={"a b]\n[x": McpServer(url="http://x/mcp")})
    with pytest.raises(ValueError, match="does not configure MCP"):
        ClaudeCode(mcp_servers={"claw": McpServer(url="http://x/mcp")})
