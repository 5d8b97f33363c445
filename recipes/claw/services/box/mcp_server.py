"""The MCP face of the Claw services: the PyPI ``mcp`` package's server (2.3.0, lowlevel
``Server``), its tools listed from and its calls carried to the HTTP API of :mod:`.server`.

It holds no state and no secret: every ``tools/call`` becomes ``POST /v1/tools/<name>``
with ``X-Claw-Channel: mcp``, so it lands in the same audit log as an HTTP call, and the
tool list is read again on each ``tools/list`` (a reset may change the services offered).
Two transports: streamable HTTP (``--port N``, path ``/mcp``, loopback only, the package's
DNS-rebinding protection on) for harnesses that take an MCP URL, and stdio (no
``--port``) for harnesses that launch their MCP servers as commands.

A tool's answer is one text block (the JSON the HTTP API returned) plus the same as
``structured_content``; ``is_error`` is true when the call failed (bad arguments, an id
that is not there): the model sees the error and may correct itself, as the MCP spec asks.
"""

from __future__ import annotations

import argparse
import json
import os
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

import anyio
import mcp_types as types
from mcp.server.lowlevel import Server

TIMEOUT = 60.0
MAX_ANSWER = 8 << 20


def _request(base: str, method: str, path: str, body: bytes | None = None) -> tuple[int, Any]:
    request = urllib.request.Request(
        base.rstrip("/") + path,
        data=body,
        method=method,
        headers={"Content-Type": "application/json", "X-Claw-Channel": "mcp"},
    )
    try:
        with urllib.request.urlopen(request, timeout=TIMEOUT) as answer:
            status, data = answer.status, answer.read(MAX_ANSWER)
    except urllib.error.HTTPError as err:
        status, data = err.code, err.read(MAX_ANSWER)
    return status, json.loads(data.decode("utf-8"))


def build(base: str) -> Server[Any]:
    async def list_tools(
        ctx: Any, params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        _, answer = await anyio.to_thread.run_sync(_request, base, "GET", "/v1/tools")
        return types.ListToolsResult(
            tools=[
                types.Tool(
                    name=t["function"]["name"],
                    description=t["function"].get("description"),
                    input_schema=t["function"]["parameters"],
                )
                for t in answer["tools"]
            ]
        )

    async def call_tool(ctx: Any, params: types.CallToolRequestParams) -> types.CallToolResult:
        body = json.dumps(params.arguments or {}).encode()
        name = urllib.parse.quote(params.name, safe="")
        try:
            _, answer = await anyio.to_thread.run_sync(
                _request, base, "POST", f"/v1/tools/{name}", body
            )
        except (OSError, ValueError) as err:
            answer = {"ok": False, "error": {"code": "unavailable", "message": str(err)[:500]}}
        return types.CallToolResult(
            content=[types.TextContent(text=json.dumps(answer, ensure_ascii=False))],
            structured_content=answer,
            is_error=not answer.get("ok", False),
        )

    return Server(
        "claw-services",
        version="1",
        instructions="Mock personal-assistant services (mail, calendar, contacts, files, "
        "to-dos, web search, tau2 domains) for this task.",
        on_list_tools=list_tools,
        on_call_tool=call_tool,
    )


async def _stdio(server: Server[Any]) -> None:
    from mcp.server.stdio import stdio_server

    async with stdio_server() as (read_stream, write_stream):
        await server.run(read_stream, write_stream, server.create_initialization_options())


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="The Claw services' MCP server.")
    parser.add_argument("--base", required=True, help="the services' HTTP API")
    parser.add_argument("--port", type=int, help="serve streamable HTTP here (else stdio)")
    parser.add_argument("--host", default="127.0.0.1")
    args = parser.parse_args(argv)
    server = build(args.base)
    if args.port is None:
        anyio.run(_stdio, server)
        return
    import socket

    import uvicorn

    # bound before we say so: the driver waits for the line, connections queue until
    # uvicorn accepts them
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind((args.host, args.port))
    sock.listen(64)
    print(json.dumps({"listening": sock.getsockname()[1], "pid": os.getpid()}), flush=True)
    app = server.streamable_http_app(host=args.host)
    config = uvicorn.Config(app, log_level="warning", access_log=False)
    anyio.run(uvicorn.Server(config).serve, [sock])
