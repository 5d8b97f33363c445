"""The Claw services in real sandboxes (``orchard up``, runc, network ``none``), driven by
``ClawServices`` exactly as the recipe does: start, the driver's tool calls, the agent's
(the ``claw`` command inside the sandbox), audit, state, reset; the MCP server reached by
the real ``mcp`` client over a port forward; the tau2 domains graded by tau2's DB check;
and an agent that attacks the services: reads their process, calls the admin channel,
kills them, serves a fake on their port.

Needs the runtime (``make claw-services``) and the default image (``make image``).
"""

from __future__ import annotations

import asyncio
import json
import shlex
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import TypeVar

import pytest
from mcp import Client
from orchard.recipes.claw import tau2
from orchard.recipes.claw.services import (
    ClawServices,
    Fixtures,
    RuntimeNotBuilt,
    ServiceOptions,
    ServicesLost,
    ServicesTampered,
    runtime,
)

from orchard import AsyncOrchard, AsyncSandbox
from tests.stack import REQUIRES_STACK, Stack, running_stack

from .sample_fixtures import sample_fixtures

pytestmark = [
    *REQUIRES_STACK,
    pytest.mark.timeout(300),
    pytest.mark.skipif(runtime.find() is None, reason="no runtime: make claw-services"),
]

T = TypeVar("T")


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    home: Path = tmp_path_factory.mktemp("claw") / "home"
    home.mkdir()
    with running_stack(home) as running:
        yield running


def _run(stack: Stack, body: Callable[[AsyncOrchard, AsyncSandbox], Awaitable[T]]) -> T:
    async def main() -> T:
        key = (stack.home / "dev-api-key").read_text().strip()
        async with AsyncOrchard(stack.endpoint, key) as client:
            sandbox = await client.sandboxes.create(network="none", memory="1Gi", ttl=600)
            try:
                return await body(client, sandbox)
            finally:
                await sandbox.delete()

    return asyncio.run(main())


async def _sh(sandbox: AsyncSandbox, script: str) -> tuple[int, str]:
    done = await sandbox.exec(["sh", "-c", script], timeout=60)
    return done.exit_code, done.stdout_text + done.stderr_text


def test_services_serve_the_driver_and_the_agent_in_a_none_sandbox(stack: Stack) -> None:
    async def body(client: AsyncOrchard, sandbox: AsyncSandbox) -> None:
        services = await ClawServices.start(sandbox, sample_fixtures())
        async with services:
            assert (await services.health()).services == [
                "mail", "calendar", "contacts", "files", "todo", "web",
            ]  # fmt: skip
            assert len(services.tool_specs()) == 26
            answer = json.loads(await services.call_tool("mail_search", {"query": "lunch"}))
            assert [m["id"] for m in answer["result"]["messages"]] == ["m1"]
            # the model's own argument string, as it wrote it
            answer = json.loads(
                await services.call_tool("files_read", '{"path": "notes/todo.txt"}')
            )
            assert answer["result"]["text"] == "buy milk\n"
            bad = json.loads(await services.call_tool("files_read", '{"path": "../../etc/passwd"}'))
            assert bad["error"]["code"] == "forbidden"
            assert (
                json.loads(await services.call_tool("nope", "{}"))["error"]["code"]
                == "unknown_tool"
            )
            # the agent's side: the claw command of the sandbox (no curl in the image)
            claw = services.claw_command_in_sandbox
            code, out = await _sh(sandbox, f"{claw} mail_send " + shlex.quote(json.dumps(
                {"to": ["bob@example.org"], "subject": "Lunch", "body": "Friday works."})))  # fmt: skip
            assert code == 0 and json.loads(out)["ok"], out
            code, out = await _sh(sandbox, f'{claw} todo_complete \'{{"todo_id": "t2"}}\'')
            assert code == 1 and json.loads(out)["error"]["code"] == "conflict"
            code, out = await _sh(sandbox, f"{claw} tools")
            assert code == 0 and out.splitlines()[0].startswith("mail_list(folder?, ")
            assert "mail_send" in services.usage() and claw in services.usage()
            # the files tools and the agent's shell see the same folder
            code, out = await _sh(sandbox, "cat /workspace/files/notes/todo.txt")
            assert out == "buy milk\n"
            entries = await services.audit()
            assert [(e.tool, e.status, e.channel) for e in entries] == [
                ("mail_search", "ok", "driver"), ("files_read", "ok", "driver"),
                ("files_read", "error", "driver"), ("nope", "error", "driver"),
                ("mail_send", "ok", "http"), ("todo_complete", "error", "http"),
            ]  # fmt: skip
            assert [e.seq for e in entries] == list(range(1, 7))
            state = await services.state()
            sent = [m for m in state["mail"]["messages"] if m["folder"] == "sent"]
            assert [(m["to"], m["subject"]) for m in sent] == [(["bob@example.org"], "Lunch")]
            await services.reset()
            assert await services.audit() == []
            assert [
                m for m in (await services.state())["mail"]["messages"] if m["folder"] == "sent"
            ] == []
            print(json.dumps({"start_seconds": services.start_seconds}))

    _run(stack, body)


def test_the_agent_cannot_reach_the_audit_log_but_through_calls(stack: Stack) -> None:
    async def body(client: AsyncOrchard, sandbox: AsyncSandbox) -> None:
        services = await ClawServices.start(sandbox, sample_fixtures())
        async with services:
            await services.call_tool("mail_list", {})
            pid = (await services.health()).pid
            # the process is not dumpable: root in the sandbox (no CAP_SYS_PTRACE) reads
            # neither its memory nor its environment nor its descriptors (the stdin the
            # secret came on)
            probe = (
                "import os, sys\n"
                f"pid = {pid}\n"
                "for path in (f'/proc/{pid}/environ', f'/proc/{pid}/mem', f'/proc/{pid}/fd/0'):\n"
                "    try:\n"
                "        open(path, 'rb').read(1)\n"
                "        print('READ', path)\n"
                "    except OSError as err:\n"
                "        print('refused', path, err.errno)\n"
                "try:\n"
                "    print('READ', os.readlink(f'/proc/{pid}/fd/0'))\n"
                "except OSError as err:\n"
                "    print('refused readlink', err.errno)\n"
            )
            done = await sandbox.exec(["python3", "-c", probe], timeout=30)
            assert "READ" not in done.stdout_text and done.stdout_text.count("refused") == 4, done
            # the admin channel answers nobody without the secret
            call = (
                "import urllib.request as u, urllib.error as e\n"
                "for op in ('audit', 'reset', 'state'):\n"
                "    try:\n"
                f"        u.urlopen(u.Request('{services.http_base_in_sandbox}/admin/' + op, "
                "data=b'{\"fixtures\": {\"todo\": {}}}', headers={'X-Claw-Nonce': 'n', "
                "'X-Claw-Auth': 'x'}))\n"
                "        print('ANSWERED', op)\n"
                "    except e.HTTPError as err:\n"
                "        print(op, err.code)\n"
            )
            done = await sandbox.exec(["python3", "-c", call], timeout=30)
            assert done.stdout_text.split() == ["audit", "401", "reset", "401", "state", "401"]
            # the refused calls neither reset the services nor entered the log
            assert [e.tool for e in await services.audit()] == ["mail_list"]
            # no file holds the log: nothing to edit
            _, out = await _sh(sandbox, "grep -rl --exclude='*.py' --exclude='*.pyc' mail_list "
                                        "/opt /tmp /var/tmp /workspace /root 2>/dev/null || true")  # fmt: skip
            assert out.strip() == "", out

            # killed: the driver is told the services are lost (the agent's doing)
            await _sh(sandbox, f"kill -9 {pid}")
            with pytest.raises(ServicesLost) as lost:
                await services.audit()
            assert lost.value.fault == "task" and "signal 9" in str(lost.value)
            # a fake on their port cannot sign for them
            fake = (
                "import http.server, json\n"
                "class H(http.server.BaseHTTPRequestHandler):\n"
                "    def do_POST(self):\n"
                "        body = json.dumps({'ok': True, 'entries': []}).encode()\n"
                "        self.send_response(200); self.send_header('X-Claw-Signature', '0' * 64)\n"
                "        self.send_header('Content-Length', str(len(body))); self.end_headers()\n"
                "        self.wfile.write(body)\n"
                "    do_GET = do_POST\n"
                f"http.server.HTTPServer(('127.0.0.1', {services.options.port}), H).serve_forever()\n"
            )
            await sandbox.write_file("/tmp/fake.py", fake)
            await sandbox.start(["python3", "/tmp/fake.py"])
            # bounded wait until the fake listens (a fixed 0.5 s was too short under load)
            listening = (
                "import socket, time\n"
                "for _ in range(300):\n"
                "    try:\n"
                f"        socket.create_connection(('127.0.0.1', {services.options.port}), 1).close()\n"
                "        break\n"
                "    except OSError:\n"
                "        time.sleep(0.1)\n"
                "else:\n"
                "    raise SystemExit('the fake never listened')\n"
            )
            assert (await sandbox.exec(["python3", "-c", listening], timeout=60)).exit_code == 0
            with pytest.raises(ServicesTampered) as tampered:
                await services.audit()
            assert tampered.value.fault == "task"

    _run(stack, body)


def test_mcp_in_the_sandbox_through_the_real_client(stack: Stack) -> None:
    async def body(client: AsyncOrchard, sandbox: AsyncSandbox) -> None:
        services = await ClawServices.start(sandbox, sample_fixtures(), ServiceOptions(mcp=True))
        async with services, await sandbox.forward_port(services.options.mcp_port) as forward:
            async with Client(f"{forward.url}/mcp") as mcp:
                names = [t.name for t in (await mcp.list_tools()).tools]
                assert names == [t["function"]["name"] for t in services.tool_specs()]
                done = await mcp.call_tool("calendar_create", {
                    "title": "Lunch", "start": "2026-03-06T12:00:00Z", "end": "2026-03-06T13:00:00Z"})  # fmt: skip
                assert not done.is_error, done
            # the stdio server a harness would launch, run inside the sandbox
            stdio = services.mcp_stdio_command_in_sandbox
            init = [
                {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
                    "protocolVersion": "2025-06-18", "capabilities": {},
                    "clientInfo": {"name": "t", "version": "1"}}},
                {"jsonrpc": "2.0", "method": "notifications/initialized"},
                {"jsonrpc": "2.0", "id": 2, "method": "tools/call",
                 "params": {"name": "todo_list", "arguments": {"status": "all"}}},
            ]  # fmt: skip
            process = await sandbox.start(stdio, stdin=True)
            for message in init:
                await process.write(json.dumps(message) + "\n")
            result, output = None, b""
            async with asyncio.timeout(60):
                async for event in process.output():
                    output += getattr(event, "data", b"")
                    answers = [json.loads(x) for x in output.splitlines() if x.startswith(b"{")]
                    result = next((a["result"] for a in answers if a.get("id") == 2), None)
                    if result is not None:
                        break
            await process.close_stdin()
            assert result is not None, output
            assert (
                result["isError"] is False and result["structuredContent"]["result"]["total"] == 2
            )
            entries = await services.audit()
            assert [(e.tool, e.channel) for e in entries] == [
                ("calendar_create", "mcp"), ("todo_list", "mcp"),
            ]  # fmt: skip
            print(json.dumps({"start_seconds_with_mcp": services.start_seconds}))

    _run(stack, body)


@pytest.mark.parametrize("domain", tau2.DOMAINS)
def test_tau2_tasks_pass_with_their_gold_actions_and_fail_a_null_run(
    stack: Stack, domain: tau2.Domain
) -> None:
    async def body(client: AsyncOrchard, sandbox: AsyncSandbox) -> None:
        tasks = [tau2.get_task(domain, i) for i in tau2.SAMPLE_TASKS[domain]]
        services = await ClawServices.start(sandbox, tasks[0].fixtures())
        async with services:
            names = set(services.tool_names())
            for task in tasks:
                await services.reset(task.fixtures())
                null = tau2.check(task, await services.state(), await services.audit())
                assert not null.db_match and null.score == 0.0
                for action in task.actions:
                    assert action["name"] in names
                    answer = json.loads(
                        await services.call_tool(action["name"], action["arguments"])
                    )
                    assert answer["ok"], (task.id, action, answer)
                graded = tau2.check(task, await services.state(), await services.audit())
                assert graded.db_match and graded.score == 1.0, graded
                assert graded.write_actions_done == graded.write_actions_expected > 0
                assert graded.failed_calls == 0

    _run(stack, body)


def test_a_node_without_the_runtime_is_told_how_to_build_it(stack: Stack, tmp_path: Path) -> None:
    async def body(client: AsyncOrchard, sandbox: AsyncSandbox) -> None:
        with pytest.raises(RuntimeNotBuilt, match="make claw-services"):
            await ClawServices.start(
                sandbox, Fixtures(todo=sample_fixtures().todo), ServiceOptions(runtime=tmp_path)
            )

    _run(stack, body)
