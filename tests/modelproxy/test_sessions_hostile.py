"""Who may call: forged and other sessions' credentials, path tricks, other tenants, no key,
oversized and trickled bodies. Every refusal is a status with a JSON error body."""

from __future__ import annotations

import json
import socket
import time
import urllib.parse
from concurrent import futures
from pathlib import Path

import openai
import pytest

from orchard.testing.scripted_model import ScriptedUpstream

from .conftest import Proxy, start_proxy, stop_proxy

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


def _path(credential: str) -> str:
    return f"/s/{credential}/v1/chat/completions"


def _refused(status: int, answer: object, expected: int) -> str:
    assert status == expected, (status, answer)
    assert isinstance(answer, dict) and answer["error"]["message"], answer
    return str(answer["error"]["code"])


def test_forged_and_other_sessions_credentials_are_refused(
    proxy: Proxy, upstream: tuple[ScriptedUpstream, str]
) -> None:
    mine, theirs = proxy.session(), proxy.session(key="key-bob")
    my_id, my_secret = mine["credential"].split(".")
    their_id, their_secret = theirs["credential"].split(".")
    forged = [
        f"{my_id}.{their_secret}",  # another session's secret
        f"{their_id}.{my_secret}",  # another session's id
        f"{my_id}.{my_secret[:-1]}",  # one character short
        f"{my_id}.",
        my_id,
        f"ses_{'0' * 24}.{my_secret}",
        "x" * 5000,
        urllib.parse.quote(f"{my_id}.{my_secret}/../{their_id}", safe=""),
    ]
    for credential in forged:
        code = _refused(*proxy.call("POST", _path(credential), CHAT, key=None), 401)
        assert code == "SESSION_INVALID"
    assert upstream[0].requests == []  # nothing forged reached the model


def test_paths_outside_a_session_are_refused_as_json(proxy: Proxy) -> None:
    mine = proxy.session()
    for path in [
        "/v1/chat/completions",
        "/s//v1/chat/completions",
        f"/s/{mine['credential']}/../../v1/chat/completions",
        f"/s/{mine['credential']}/v1/../v1/sessions",
        f"/s/{mine['credential']}/v1/completions",
    ]:
        status, answer = proxy.call("POST", path, CHAT, key=None)
        assert status in (401, 404, 405), (path, status, answer)
        assert isinstance(answer, dict) and "error" in answer, (path, answer)


def test_admin_calls_need_the_owning_tenants_key(proxy: Proxy) -> None:
    mine = proxy.session()
    assert _refused(*proxy.call("POST", "/v1/sessions", {}, key=None), 401) == "API_KEY_MISSING"
    assert _refused(*proxy.call("POST", "/v1/sessions", {}, key="wrong"), 401) == "API_KEY_INVALID"
    for path in (f"/v1/sessions/{mine['id']}", f"/v1/sessions/{mine['id']}/calls"):
        assert _refused(*proxy.call("GET", path, key="key-bob"), 403) == "SESSION_FORBIDDEN"
        assert _refused(*proxy.call("GET", path, key=None), 401) == "API_KEY_MISSING"
    finish = f"/v1/sessions/{mine['id']}/finish"
    assert _refused(*proxy.call("POST", finish, {"reward": 1}, key="key-bob"), 403)
    unknown = proxy.call("GET", "/v1/sessions/ses_000000000000000000000000", key="key-bob")
    assert _refused(*unknown, 403) == "SESSION_FORBIDDEN"  # absent and not-yours look alike
    assert proxy.call("GET", f"/v1/sessions/{mine['id']}")[0] == 200
    bad = proxy.call("POST", "/v1/sessions", {"model_version": 3})
    assert _refused(*bad, 400) == "INVALID_REQUEST"
    bad = proxy.call("POST", "/v1/sessions", {"tenant": "bob"})
    assert "unknown fields: tenant" in bad[1]["error"]["message"]


def test_a_finished_session_takes_no_more_calls(
    proxy: Proxy, upstream: tuple[ScriptedUpstream, str]
) -> None:
    session = proxy.session()
    status, done = proxy.call("POST", f"/v1/sessions/{session['id']}/finish", {"reward": 0.5})
    assert status == 200 and done["reward"] == 0.5
    client = openai.OpenAI(base_url=session["openai_base_url"], api_key="x", max_retries=0)
    with pytest.raises(openai.PermissionDeniedError, match="finished"):
        client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
    bad = proxy.call("POST", f"/v1/sessions/{session['id']}/finish", {"fault": "maybe"})
    assert _refused(*bad, 400)


def test_oversized_bodies_are_refused(proxy: Proxy, upstream: tuple[ScriptedUpstream, str]) -> None:
    session = proxy.session()
    big = {**CHAT, "messages": [{"role": "user", "content": "x" * 70_000}]}
    code = _refused(*proxy.call("POST", _path(session["credential"]), big, key=None), 413)
    assert code == "BODY_TOO_LARGE"
    # the same without a Content-Length (chunked): counted as it arrives
    host, port = proxy.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as conn:
        conn.sendall(
            f"POST {_path(session['credential'])} HTTP/1.1\r\nHost: x\r\n"
            "Transfer-Encoding: chunked\r\nContent-Type: application/json\r\n\r\n".encode()
        )
        piece = b"x" * 16384
        try:
            for _ in range(8):
                conn.sendall(f"{len(piece):x}\r\n".encode() + piece + b"\r\n")
        except OSError:
            pass  # the proxy may close as soon as it has refused
        answer = conn.recv(4096).decode()
    assert answer.startswith("HTTP/1.1 413"), answer[:200]
    assert upstream[0].requests == []


def test_a_trickled_body_times_out_and_others_are_served_meanwhile(
    proxy: Proxy, upstream: tuple[ScriptedUpstream, str]
) -> None:
    session = proxy.session()
    upstream[0].script.append({"content": "still here"})
    host, port = proxy.url.removeprefix("http://").split(":")
    started = time.monotonic()
    with socket.create_connection((host, int(port)), timeout=20) as slow:
        slow.sendall(
            f"POST {_path(session['credential'])} HTTP/1.1\r\nHost: x\r\n"
            "Content-Length: 1000\r\nContent-Type: application/json\r\n\r\n{".encode()
        )
        client = openai.OpenAI(base_url=session["openai_base_url"], api_key="x", max_retries=0)
        answer = client.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "hi"}]
        )
        assert answer.choices[0].message.content == "still here"
        reply = slow.recv(4096).decode()
    assert reply.startswith("HTTP/1.1 408"), reply[:200]
    assert json.loads(reply.split("\r\n\r\n", 1)[1])["error"]["code"] == "BODY_TIMEOUT"
    assert time.monotonic() - started < 10


def test_gateway_down_is_503_never_an_open_door(
    tmp_path: Path, upstream: tuple[ScriptedUpstream, str]
) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = f"127.0.0.1:{s.getsockname()[1]}"
    proxy = start_proxy(tmp_path, upstream[1], dead)
    try:
        status, answer = proxy.call("POST", "/v1/sessions", {})
        assert _refused(status, answer, 503) == "GATEWAY_UNAVAILABLE"
    finally:
        stop_proxy(proxy)


def test_a_sessions_fan_out_beyond_its_share_is_refused(
    tmp_path: Path, upstream: tuple[ScriptedUpstream, str], gateway: str
) -> None:
    server, url = upstream
    server.script.append({"content": "slow"})
    server.repeat_last = True
    server.delay_seconds = 1.0
    proxy = start_proxy(tmp_path, url, gateway, "--max-concurrent-calls-per-session", "2")
    try:
        session = proxy.session()
        client = openai.OpenAI(base_url=session["openai_base_url"], api_key="x", max_retries=0)

        def one(_: int) -> str:
            try:
                client.chat.completions.create(
                    model="m", messages=[{"role": "user", "content": "hi"}]
                )
                return "ok"
            except openai.RateLimitError as err:
                assert "calls in flight" in str(err)
                return "refused"

        with futures.ThreadPoolExecutor(4) as pool:
            outcomes = sorted(pool.map(one, range(4)))
        assert outcomes.count("ok") == 2 and outcomes.count("refused") == 2, outcomes
        other = proxy.session()  # another session of the same tenant has its own share
        server.delay_seconds = 0.0
        openai.OpenAI(base_url=other["openai_base_url"], api_key="x", max_retries=0).chat.completions.create(
            model="m", messages=[{"role": "user", "content": "hi"}])  # fmt: skip
    finally:
        stop_proxy(proxy)
