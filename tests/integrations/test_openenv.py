"""``orchard.integrations.openenv.OrchardProvider`` under OpenEnv's own client.

A real environment server runs in a sandbox of the default image and OpenEnv's
``GenericEnvClient`` (openenv-core, the real package) reaches it through the URL the
provider's ``start_container`` returns, over its WebSocket; ``from_docker_image`` is
OpenEnv's own path through ``start_container`` -> ``wait_for_ready`` -> ``close()`` ->
``stop_container``.

The server is ``openenv_server.py`` beside this file, on Python's stdlib alone, not
OpenEnv's ``openenv.core.env_server``: that one needs FastAPI, uvicorn, compiled
pydantic-core and fastmcp's tree, which the default image lacks and a sandbox with
network ``none`` cannot install. It implements the same wire contract (``/health``,
``/reset``, ``/step``, ``/state``, ``/ws``); the client side is entirely OpenEnv's.
"""

from __future__ import annotations

import asyncio
import json
import time
import urllib.request
from pathlib import Path

import pytest
from openenv.core import GenericEnvClient

import orchard
from orchard.integrations.openenv import OrchardProvider
from tests.stack import REQUIRES_STACK, Stack

pytestmark = [*REQUIRES_STACK, pytest.mark.timeout(180)]

IMAGE = "debian:bookworm"
SERVER = (Path(__file__).parent / "openenv_server.py").read_text()
SERVER_PATH = "/srv/env/openenv_server.py"


def _provider(port: int = 8000) -> OrchardProvider:
    return OrchardProvider(
        ["python3", SERVER_PATH, str(port)], files={SERVER_PATH: SERVER}, cwd="/srv/env"
    )


def _state(sandbox_id: str) -> str:
    with orchard.Orchard() as client:
        return client.sandboxes.connect(sandbox_id).last_info.state


def test_env_client_runs_an_episode_through_the_provider(stack: Stack) -> None:
    provider = _provider()

    async def episode() -> None:
        env = await GenericEnvClient.from_docker_image(IMAGE, provider=provider)
        try:
            assert provider.sandbox is not None
            seen.append(provider.sandbox)
            first = await env.reset(target=5)
            assert (first.observation, first.reward, first.done) == (
                {"count": 0, "target": 5},
                None,
                False,
            )
            rewards = []
            for add in (1, 2, 2):
                result = await env.step({"add": add})
                rewards.append(result.reward)
            assert rewards == [-4, -2, 0]
            assert result.done and result.observation == {"count": 5, "target": 5}
            state = await env.state()
            assert state["step_count"] == 3 and state["count"] == 5
            with pytest.raises(RuntimeError, match="integer 'add'"):  # its error frame
                await env.step({"add": "two"})
        finally:
            await env.close()  # OpenEnv's close() calls stop_container

    seen: list[orchard.Sandbox] = []
    asyncio.run(episode())
    (sandbox,) = seen
    assert sandbox.last_info.network.mode == "none"  # the forward opened nothing
    assert provider.sandbox is None
    assert _state(sandbox.id) in ("deleting", "deleted")


def test_provider_alone_serves_http_and_the_sync_client(stack: Stack) -> None:
    provider = _provider(port=9123)
    url = provider.start_container(IMAGE, port=9123, env_vars={"EPISODE_TAG": "x"})
    try:
        assert url.startswith("http://127.0.0.1:")
        provider.wait_for_ready(url, timeout_s=60)
        with urllib.request.urlopen(f"{url}/health", timeout=10) as resp:
            assert json.loads(resp.read()) == {"status": "healthy"}
        post = urllib.request.Request(
            f"{url}/step", data=json.dumps({"action": {"add": 3}}).encode(), method="POST"
        )
        with urllib.request.urlopen(post, timeout=10) as resp:
            assert json.loads(resp.read())["done"] is True  # HTTP endpoints: target 3
        with GenericEnvClient(base_url=url).sync() as env:
            assert env.reset(target=2).observation == {"count": 0, "target": 2}
            assert env.step({"add": 2}).done
        assert provider.sandbox is not None
        env_seen = provider.sandbox.exec("printenv EPISODE_TAG").stdout_text.strip()
        assert env_seen == "x"  # env_vars are the sandbox's environment
        with pytest.raises(RuntimeError, match="already runs sandbox"):
            provider.start_container(IMAGE)
    finally:
        sandbox = provider.sandbox
        provider.stop_container()
        provider.stop_container()  # a no-op the second time
    assert sandbox is not None and _state(sandbox.id) in ("deleting", "deleted")


def test_a_server_that_exits_is_a_runtime_error_with_its_output(stack: Stack) -> None:
    provider = OrchardProvider("echo no such module >&2; exit 3")
    url = provider.start_container(IMAGE)
    try:
        with pytest.raises(RuntimeError, match="no such module"):
            provider.wait_for_ready(url, timeout_s=30)
    finally:
        provider.stop_container()


def test_a_server_that_never_listens_times_out(stack: Stack) -> None:
    provider = OrchardProvider("sleep 600")
    url = provider.start_container(IMAGE)
    started = time.monotonic()
    try:
        with pytest.raises(TimeoutError, match="not ready after 2s"):
            provider.wait_for_ready(url, timeout_s=2)
        assert time.monotonic() - started < 20
    finally:
        provider.stop_container()


def test_what_cannot_start_is_a_runtime_error(stack: Stack) -> None:
    provider = _provider()
    with pytest.raises(RuntimeError, match="could not create a sandbox of no-such-image"):
        provider.start_container("no-such-image:latest")
    assert provider.sandbox is None
    with pytest.raises(ValueError, match="does not know"):
        provider.start_container(IMAGE, detach=True)  # a docker-run option
    with pytest.raises(ValueError, match="not a TCP port"):
        provider.start_container(IMAGE, port=70000)
