"""``orchard.rollouts.proxy`` against the real proxy process (``python -m orchard.modelproxy``)
and the scripted upstream; the gateway's ``GetTenant`` is answered from a key table over the
real proto (``tests/modelproxy/tenant_gateway.py``: the whole gateway needs runc). Each refusal
the proxy documents arrives as its own exception with the proxy's code."""

from __future__ import annotations

import asyncio
import re
import socket
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest

from orchard.rollouts import ModelProxyClient
from orchard.rollouts import proxy as mp
from orchard.testing.scripted_model import ScriptedUpstream, scripted_upstream
from tests.modelproxy.conftest import Proxy, start_proxy, stop_proxy
from tests.modelproxy.tenant_gateway import tenant_gateway

KEYS = {"key-alice": "alice", "key-bob": "bob"}


@pytest.fixture
def live(tmp_path: Path) -> Iterator[tuple[Proxy, ScriptedUpstream]]:
    with (
        tenant_gateway(KEYS) as gateway,
        scripted_upstream([{"content": "hi there"}]) as (server, url),
    ):
        started = start_proxy(tmp_path, url, gateway)
        try:
            yield started, server
        finally:
            stop_proxy(started)


def test_a_session_created_used_finished_and_read_back(
    live: tuple[Proxy, ScriptedUpstream],
) -> None:
    proxy, _server = live

    async def main() -> None:
        async with ModelProxyClient(proxy.url, "key-alice") as client:
            made = await client.create_session("step-3", {"task": "t1"})
            assert made.info.tenant == "alice" and made.info.model_version == "step-3"
            assert made.openai_base_url == f"{proxy.url}/s/{made.credential}/v1"
            assert made.credential not in repr(made)  # never printed by accident
            async with openai.AsyncOpenAI(
                base_url=made.openai_base_url, api_key="x", max_retries=0
            ) as model:
                answer = await model.chat.completions.create(
                    model="m", messages=[{"role": "user", "content": "hello"}]
                )
            assert answer.choices[0].message.content == "hi there"
            info = await client.session(made.id)
            assert info.calls == 1 and not info.finished
            done = await client.finish(made.id, reward=0.5, fault="", fault_message="")
            assert done.finished and done.reward == 0.5 and done.calls == 1
            calls = await client.calls(made.id)
            assert [c["index"] for c in calls] == [0] and calls[0]["model_version"] == "step-3"
            samples = await client.samples(made.id)
            assert len(samples) == 1 and samples[0]["reward"] == 0.5
            assert samples[0]["token_exact"] is True
            # a finished session refuses the harness's next call
            async with openai.AsyncOpenAI(
                base_url=made.openai_base_url, api_key="x", max_retries=0
            ) as model:
                with pytest.raises(openai.PermissionDeniedError) as finished:
                    await model.chat.completions.create(
                        model="m", messages=[{"role": "user", "content": "again"}]
                    )
                assert finished.value.code == "SESSION_FINISHED"
            with pytest.raises(ValueError, match="fault must be one of"):
                await client.finish(made.id, fault="agent")

    asyncio.run(main())


def test_each_documented_refusal_is_its_own_error(live: tuple[Proxy, ScriptedUpstream]) -> None:
    proxy, _server = live

    async def main() -> None:
        async with (
            ModelProxyClient(proxy.url, "key-alice") as alice,
            ModelProxyClient(proxy.url, "key-bob") as bob,
            ModelProxyClient(proxy.url, "key-mallory") as mallory,
        ):
            with pytest.raises(mp.ProxyAuthError) as refused:
                await mallory.create_session()
            assert (refused.value.status, refused.value.code) == (401, "API_KEY_INVALID")
            theirs = await bob.create_session()
            for call in (alice.session, alice.calls, alice.samples, alice.finish):
                with pytest.raises(mp.SessionForbiddenError) as forbidden:
                    await call(theirs.id)
                assert forbidden.value.status == 403
            with pytest.raises(mp.SessionForbiddenError):
                await alice.session("../../v1/sessions")  # quoted: one path segment
            with pytest.raises(mp.ProxyRequestError) as bad:
                await alice.create_session(metadata={"big": "x" * 20_000})
            assert (bad.value.status, bad.value.code) == (400, "INVALID_REQUEST")

    asyncio.run(main())


def test_an_unreachable_or_foreign_server_is_told_apart(
    live: tuple[Proxy, ScriptedUpstream], tmp_path: Path
) -> None:
    _proxy, server = live

    async def main() -> None:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]  # bound, never listening: connection refused
            async with ModelProxyClient(f"http://127.0.0.1:{port}", "k", timeout=5) as dead:
                with pytest.raises(mp.ProxyUnreachableError) as unreachable:
                    await dead.create_session()
                assert unreachable.value.status == 0
        # the scripted upstream is an HTTP server, not a proxy: its answers are not sessions
        with scripted_upstream([{"status": 500, "content": "boom"}]) as (_s, url):
            async with ModelProxyClient(url.removesuffix("/v1"), "k") as foreign:
                with pytest.raises(mp.ProxyProtocolError):
                    await foreign.create_session()
                with pytest.raises(mp.ProxyProtocolError):
                    await foreign.session("ses_0")
        with pytest.raises(mp.ProxyUnreachableError, match="no model proxy address"):
            mp.local_proxy_url(tmp_path / "no-stack-here")
        with pytest.raises(ValueError):
            ModelProxyClient("127.0.0.1:1", "k")

    asyncio.run(main())
    assert server.requests == []  # nothing of this reached the model


def test_a_proxy_without_its_gateway_says_so(tmp_path: Path) -> None:
    with socket.socket() as sock, scripted_upstream([]) as (_server, url):
        sock.bind(("127.0.0.1", 0))
        started = start_proxy(tmp_path, url, f"127.0.0.1:{sock.getsockname()[1]}")
        try:

            async def main() -> None:
                async with ModelProxyClient(started.url, "key-alice") as client:
                    with pytest.raises(mp.ProxyUnavailableError) as down:
                        await client.create_session()
                    assert (down.value.status, down.value.code) == (503, "GATEWAY_UNAVAILABLE")

            asyncio.run(main())
        finally:
            stop_proxy(started)


def test_every_documented_code_has_its_error() -> None:
    """The codes docs/modelproxy.md lists (and the proxy's own TOO_MANY_SESSIONS) map to a
    subclass; an unknown code still raises a ProxyError carrying it."""
    doc = (Path(__file__).resolve().parents[2] / "docs" / "modelproxy.md").read_text()
    documented = set(re.findall(r"`([A-Z][A-Z_]{5,})`", doc)) - {"ORCHARD_MODEL_UPSTREAM"}
    documented = {c for c in documented if not c.startswith("ORCHARD_")}
    assert documented <= set(mp.REFUSALS), documented - set(mp.REFUSALS)
    err = mp.refusal(418, b'{"error": {"code": "TEAPOT", "message": "short and stout"}}')
    assert type(err) is mp.ProxyError and err.code == "TEAPOT" and err.status == 418
    assert isinstance(mp.refusal(502, b"<html>bad gateway</html>"), mp.ProxyProtocolError)
