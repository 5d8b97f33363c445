"""The model endpoint on a real ``orchard up`` stack: a sandbox with policy ``none`` reaches
the recording model proxy (a real Chat call, recorded in its session) and nothing else of
the node; a sandbox without the option has no endpoint; a connection flood is capped.

Real parts: runc sandboxes, the real model proxy ``orchard up`` starts (``--model-upstream``)
in front of ``orchard.testing.scripted_model`` (a real HTTP server following a script), the
real gateway judging the session's API key, and Python's urllib inside the sandbox.
"""

from __future__ import annotations

import json
import textwrap
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest

from orchard import Orchard, Sandbox
from orchard.testing.scripted_model import ScriptedUpstream, scripted_upstream
from tests.stack import REQUIRES_STACK, Stack, running_stack

pytestmark = REQUIRES_STACK

BASE = "http://127.0.0.1:7711"

# Inside the sandbox: one Chat call through $ORCHARD_MODEL_BASE, printing status and body.
CHAT = textwrap.dedent(
    """
    import json, os, sys, urllib.error, urllib.request
    base = os.environ["ORCHARD_MODEL_BASE"]
    body = json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}]}).encode()
    request = urllib.request.Request(base + "/s/" + sys.argv[1] + "/v1/chat/completions",
                                     data=body, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=30) as answer:
            print(json.dumps({"status": answer.status, "body": json.load(answer)}))
    except urllib.error.HTTPError as err:
        print(json.dumps({"status": err.code, "body": json.load(err)}))
    """
)


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Stack, ScriptedUpstream]]:
    home = tmp_path_factory.mktemp("endpoint") / "home"
    home.mkdir()
    policy = lambda body: {"content": "hello from the model"}  # noqa: E731
    with (
        scripted_upstream(policy) as (server, url),
        running_stack(home, up_args=["--model-upstream", url]) as running,
    ):
        yield running, server


def _client(stack: Stack) -> Orchard:
    key = (stack.home / "dev-api-key").read_text().strip()
    return Orchard(endpoint=stack.endpoint, api_key=key)


def _session(stack: Stack) -> dict[str, Any]:
    proxy = (stack.home / "run" / "modelproxy.addr").read_text().strip()
    key = (stack.home / "dev-api-key").read_text().strip()
    request = urllib.request.Request(
        f"{proxy}/v1/sessions",
        data=json.dumps({"model_version": "v7"}).encode(),
        headers={"Authorization": f"Bearer {key}"},
    )
    with urllib.request.urlopen(request, timeout=30) as answer:
        return dict(json.load(answer))


def _chat(sb: Sandbox, credential: str) -> dict[str, Any]:
    result = sb.exec(["python3", "-c", CHAT, credential], timeout=60)
    assert result.exit_code == 0, result.stderr_text
    return dict(json.loads(result.stdout_text))


def test_policy_none_reaches_the_proxy_and_the_call_is_recorded(
    stack: tuple[Stack, ScriptedUpstream],
) -> None:
    running, server = stack
    session = _session(running)
    with _client(running).sandboxes.create(network="none", model_endpoint=True) as sb:
        assert sb.info().model_endpoint == BASE
        assert sb.exec("echo $ORCHARD_MODEL_BASE").stdout_text.strip() == BASE
        answer = _chat(sb, session["credential"])
        assert answer["status"] == 200, answer
        assert answer["body"]["choices"][0]["message"]["content"] == "hello from the model"
        # still only loopback inside: no interface, no route
        assert sb.exec("cat /proc/net/route | wc -l").stdout_text.strip() == "1"
    calls = running.home / "modelproxy" / "sessions" / session["id"] / "calls.jsonl"
    record = json.loads(calls.read_text().splitlines()[0])
    assert record["request"]["messages"] == [{"role": "user", "content": "hi"}]
    assert record["model_version"] == "v7" and record["completion_token_ids"]
    assert server.requests, "the scripted upstream saw the call"


def test_a_sandbox_without_the_option_has_no_endpoint(
    stack: tuple[Stack, ScriptedUpstream],
) -> None:
    running, _ = stack
    with _client(running).sandboxes.create(network="none") as sb:
        assert sb.info().model_endpoint == ""
        assert sb.exec("echo ${ORCHARD_MODEL_BASE-unset}").stdout_text.strip() == "unset"
        probe = sb.exec(
            ["python3", "-c", "import socket; socket.create_connection(('127.0.0.1', 7711), 3)"]
        )
        assert probe.exit_code != 0 and "ConnectionRefusedError" in probe.stderr_text
