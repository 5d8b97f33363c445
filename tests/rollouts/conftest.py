"""One real stack per test module (``orchard up`` with the recording proxy) whose upstream is
the scripted model server; the policy it follows is the test's (``PolicyServer.use``)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import pytest

from orchard import AsyncOrchard
from orchard.rollouts import ModelProxyClient, local_proxy_url
from orchard.testing.scripted_model import ScriptedUpstream, scripted_upstream
from tests.stack import Stack, running_stack

T = TypeVar("T")


@dataclass
class PolicyServer:
    server: ScriptedUpstream
    url: str
    policy: Callable[[dict[str, Any]], dict[str, Any]] | None = None

    def __call__(self, body: dict[str, Any]) -> dict[str, Any]:
        if self.policy is None:
            return {"status": 500, "content": "no policy set for this test"}
        return self.policy(body)

    def use(self, policy: Callable[[dict[str, Any]], dict[str, Any]]) -> None:
        self.policy = policy


@dataclass
class RolloutStack:
    stack: Stack
    upstream: PolicyServer

    @property
    def api_key(self) -> str:
        return (self.stack.home / "dev-api-key").read_text().strip()

    @property
    def proxy_url(self) -> str:
        return local_proxy_url(self.stack.home)

    def run(self, body: Callable[[AsyncOrchard, ModelProxyClient], Awaitable[T]]) -> T:
        """``body(client, proxy)`` in a fresh event loop, with both closed after."""

        async def main() -> T:
            async with (
                AsyncOrchard(self.stack.endpoint, self.api_key) as client,
                ModelProxyClient(self.proxy_url, self.api_key) as proxy,
            ):
                return await body(client, proxy)

        return asyncio.run(main())


@pytest.fixture(scope="module")
def rollout_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RolloutStack]:
    home: Path = tmp_path_factory.mktemp("rollouts") / "home"
    home.mkdir()
    holder = PolicyServer(server=None, url="")  # type: ignore[arg-type]
    with scripted_upstream(holder) as (server, url):
        holder.server, holder.url = server, url
        with running_stack(home, up_args=["--model-upstream", url]) as stack:
            yield RolloutStack(stack, holder)
