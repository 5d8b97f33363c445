"""Each harness CLI of the tools layer makes real model calls from inside a real sandbox.

Real parts: ``orchard up`` with runc sandboxes (policy ``none``, the model endpoint and
the tools layer mounted), the real recording model proxy in front of
``orchard.testing.scripted_model`` (a real HTTP server answering "done"), and each CLI
configured by its adapter to talk only to the session's proxy URL: Codex speaks Responses
and Claude Code Messages (the proxy translates both onto Chat), OpenClaw, mini-swe-agent
and aider speak Chat. The multi-step task runs (find the bug, edit, test) are
tests/rollouts/ (helper "rollout"); here: the CLI starts, its call is recorded in the
session and reaches the upstream, and the adapter returns its transcript. A sandbox
without the layer makes the adapter return ABORTED, never a graded outcome.
"""

from __future__ import annotations

import asyncio
import json
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
from orchard.scheduler.tools import HARNESSES as LAYER

from orchard import AsyncOrchard
from orchard.rollouts import Limits, ModelEndpoint, Status, Task
from orchard.rollouts.harnesses import HARNESSES
from orchard.testing.scripted_model import ScriptedUpstream, scripted_upstream
from tests.stack import REQUIRES_STACK, TOOLS_DIR, Stack, running_stack

pytestmark = [
    *REQUIRES_STACK,
    pytest.mark.timeout(900),
    pytest.mark.skipif(
        not (TOOLS_DIR / LAYER.folder_name() / "layer.json").is_file(),
        reason="no tools layer (make tools-layer)",
    ),
]

BASE = "http://127.0.0.1:7711"


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Stack, ScriptedUpstream]]:
    home = tmp_path_factory.mktemp("harnesses") / "home"
    home.mkdir()
    with (
        scripted_upstream(lambda body: {"content": "done"}) as (server, url),
        running_stack(home, up_args=["--model-upstream", url]) as running,
    ):
        yield running, server


def _session(stack: Stack) -> dict[str, Any]:
    proxy = (stack.home / "run" / "modelproxy.addr").read_text().strip()
    key = (stack.home / "dev-api-key").read_text().strip()
    request = urllib.request.Request(
        f"{proxy}/v1/sessions", data=b"{}", headers={"Authorization": f"Bearer {key}"}
    )
    with urllib.request.urlopen(request, timeout=30) as answer:
        return dict(json.load(answer))


def _run(stack: Stack, name: str, *, tools: bool) -> tuple[Any, dict[str, Any]]:
    session = _session(stack)
    base = f"{BASE}/s/{session['credential']}"
    endpoint = ModelEndpoint(session["id"], "m", f"{base}/v1", base, f"{base}/v1", base)
    key = (stack.home / "dev-api-key").read_text().strip()

    async def main() -> Any:
        async with AsyncOrchard(stack.endpoint, key) as client:
            sb = await client.sandboxes.create(
                tools=tools, model_endpoint=True, network="none", memory="2Gi", ttl=600
            )
            try:
                setup = "mkdir -p /testbed && cd /testbed && git init -q && echo hi > a.txt"
                assert (await sb.exec(["sh", "-c", setup])).exit_code == 0
                task = Task(id="t", prompt="Reply with the word done.")
                return await HARNESSES[name]().run(
                    sb, task, endpoint, Limits(max_steps=3, max_seconds=300)
                )
            finally:
                await sb.delete()

    return asyncio.run(main()), session


@pytest.mark.parametrize("name", sorted(HARNESSES))
def test_the_cli_calls_the_model_through_the_session_proxy(
    stack: tuple[Stack, ScriptedUpstream], name: str
) -> None:
    running, server = stack
    before = len(server.requests)
    run, session = _run(running, name, tools=True)
    assert run.status == Status.COMPLETED, (run.fault, run.detail)
    assert run.steps >= 1 and run.transcript
    assert len(server.requests) > before, "no call reached the scripted upstream"
    calls = running.home / "modelproxy" / "sessions" / session["id"] / "calls.jsonl"
    records = [json.loads(line) for line in calls.read_text().splitlines() if line]
    assert records and all(r["completion_token_ids"] for r in records)
    wire = {"codex": "responses", "claude-code": "messages"}.get(name, "chat")
    assert HARNESSES[name].wire_format == wire


def test_without_the_layer_the_harness_is_aborted_not_graded(
    stack: tuple[Stack, ScriptedUpstream],
) -> None:
    running, _ = stack
    run = _run(running, "codex", tools=False)[0]
    assert run.status == Status.ABORTED
    assert run.fault and "tools=True" in run.fault
