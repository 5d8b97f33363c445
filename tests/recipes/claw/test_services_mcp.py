"""The Claw services' MCP server (``box/mcp_server.py``, the PyPI ``mcp`` package's server)
driven by the same package's real client, over streamable HTTP and over stdio, in front of
the services' HTTP server as a real process: the tools it lists are the HTTP API's, its
calls land in the same audit log (channel ``mcp``), a failed call is an ``is_error`` result
the model can read, and a reset's new tool list shows on the next listing."""

from __future__ import annotations

import asyncio
import json
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from mcp import Client, StdioServerParameters
from orchard.recipes.claw.services import Fixtures

from .box_process import LAUNCH, BoxProcess, box_process
from .sample_fixtures import sample_fixtures

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def box(tmp_path: Path) -> Iterator[BoxProcess]:
    with box_process() as process:
        process.reset(sample_fixtures(tmp_path / "files").wire())
        yield process


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture
def mcp_url(box: BoxProcess) -> Iterator[str]:
    port = _free_port()
    process = subprocess.Popen(
        [sys.executable, "-I", str(LAUNCH), "mcp", "--base", box.base, "--port", str(port)],
        stdout=subprocess.PIPE, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        assert process.stdout is not None
        line = process.stdout.readline()  # printed once the port is bound
        assert json.loads(line)["listening"] == port, line
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        process.kill()
        process.wait(10)
        if process.stdout is not None:
            process.stdout.close()


async def _session(server: str | StdioServerParameters, box: BoxProcess) -> None:
    http_tools = [t["function"] for t in box.request("GET", "/v1/tools").json["tools"]]
    async with Client(server) as client:
        listed = (await client.list_tools()).tools
        assert [t.name for t in listed] == [t["name"] for t in http_tools]
        assert [t.input_schema for t in listed] == [t["parameters"] for t in http_tools]
        done = await client.call_tool("todo_add", {"title": "Pay rent", "due": "2026-03-31"})
        assert not done.is_error
        assert done.structured_content["result"]["title"] == "Pay rent"
        assert json.loads(done.content[0].text) == done.structured_content  # type: ignore[union-attr]
        wrong = await client.call_tool("mail_read", {"message_id": "nope"})
        assert wrong.is_error and wrong.structured_content["error"]["code"] == "not_found"
        unknown = await client.call_tool("rm_rf", {})
        assert unknown.is_error and unknown.structured_content["error"]["code"] == "unknown_tool"
        box.reset(Fixtures(web=sample_fixtures().web).wire())
        assert [t.name for t in (await client.list_tools()).tools] == ["web_search", "web_fetch"]
        found = await client.call_tool("web_search", {"query": "paris weather"})
        assert found.structured_content["result"]["results"][0]["title"] == "Paris weather"
    entries = box.audit()
    assert [(e["operation"], e["status"], e["channel"]) for e in entries] == [
        ("web_search", "ok", "mcp")  # the reset emptied the log of the calls before it
    ]


def test_mcp_over_streamable_http(box: BoxProcess, mcp_url: str) -> None:
    asyncio.run(_session(mcp_url, box))


def test_mcp_over_stdio(box: BoxProcess) -> None:
    server = StdioServerParameters(
        command=sys.executable, args=["-I", str(LAUNCH), "mcp", "--base", box.base]
    )
    asyncio.run(_session(server, box))


def test_mcp_calls_are_audited_before_a_reset(box: BoxProcess, mcp_url: str) -> None:
    async def calls() -> None:
        async with Client(mcp_url) as client:
            await client.call_tool("mail_list", {"folder": "inbox"})
            await client.call_tool("files_delete", {"path": "notes/todo.txt"})

    asyncio.run(calls())
    entries = box.audit()
    assert [(e["operation"], e["channel"], e["destructive"]) for e in entries] == [
        ("mail_list", "mcp", False),
        ("files_delete", "mcp", True),
    ]
    assert "notes/todo.txt" not in box.state()["files"]["files"]
