"""The model endpoint on a real ``orchard up`` stack: a sandbox with policy ``none`` reaches
the recording model proxy (a real Chat call, recorded in its session) and nothing else of
the node; a sandbox without the option has no endpoint; a connection flood is capped.

Real parts: runc sandboxes, the real model proxy ``orchard up`` starts (``--model-upstream``)
in front of ``orchard.testing.scripted_model`` (a real HTTP server following a script), the
real gateway judging the session's API key, and Python's urllib inside the sandbox.

The attacks (issue 12's rule: a sandbox reaches the proxy and nothing else of the node):
every port of every service of the stack and of the node, on loopback and on every node
address and the bridge, directly and by asking the endpoint to go elsewhere (CONNECT,
absolute-form requests, a forged Host). A listener on 0.0.0.0 stands for every host
service and counts the connections that reach it: each attack must leave it at zero, and
every answer through the endpoint must be the model proxy's own.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import textwrap
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from orchard import InvalidRequestError, Orchard, OrchardError, Sandbox
from orchard.testing.scripted_model import ScriptedUpstream, scripted_upstream
from tests.stack import REQUIRES_STACK, Stack, running_stack

from .in_sandbox import py
from .test_egress_attacks import HostService, node_addresses

pytestmark = REQUIRES_STACK
# Small caps for this stack, so a flood reaches them in a test's time.
LIMITS = {
    "ORCHARD_MODEL_ENDPOINT_MAX_CONNECTIONS": "4",
    "ORCHARD_MODEL_ENDPOINT_MAX_CONNECTIONS_PER_TENANT": "8",
    "ORCHARD_MODEL_ENDPOINT_MAX_CONNECTIONS_NODE": "16",
}

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
        running_stack(home, LIMITS, up_args=["--model-upstream", url]) as running,
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


def test_templates_are_refused_clearly(stack: tuple[Stack, ScriptedUpstream]) -> None:
    running, _ = stack
    with pytest.raises(InvalidRequestError, match="model_endpoint: not available with a template"):
        _client(running).sandboxes.create(template="anything", model_endpoint=True)


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


# Inside: try each "host:port" of argv[1] (JSON); prints {"host:port": "ok" | error name}.
SCAN = """
import json, socket, sys
out = {}
for target in json.loads(sys.argv[1]):
    host, port = target.rsplit(":", 1)
    try:
        socket.create_connection((host, int(port)), timeout=2).close()
        out[target] = "ok"
    except OSError as e:
        out[target] = type(e).__name__
print(json.dumps(out))
"""
# Inside: send argv[1] to the endpoint as it is, read the answer until it closes.
RAW = """
import socket, sys
s = socket.create_connection(("127.0.0.1", 7711), timeout=10)
s.sendall(sys.argv[1].encode())
out = b""
try:
    while chunk := s.recv(65536):
        out += chunk
except (TimeoutError, OSError):
    pass
print(out.decode(errors="replace"))
"""


def _stack_ports(home: Any) -> list[int]:
    """Every TCP port a process of this stack (orchard up's children) listens on."""
    listening = subprocess.run(
        ["ss", "-Hltnp"], capture_output=True, text=True, check=True
    ).stdout.splitlines()
    addresses = [
        (home / "run" / name).read_text().strip().rsplit(":", 1)[1].rstrip("/")
        for name in ("gateway.addr", "scheduler.addr", "executor.addr", "modelproxy.addr")
    ]
    ports = {int(port) for port in addresses}
    ports.update(int(line.split()[3].rsplit(":", 1)[1]) for line in listening if "python" in line)
    return sorted(ports)


def test_a_none_sandbox_with_an_endpoint_reaches_nothing_else_of_the_node(
    stack: tuple[Stack, ScriptedUpstream],
) -> None:
    running, _ = stack
    host = HostService()
    try:
        ports = [*_stack_ports(running.home), host.port]
        hosts = ["127.0.0.1", "10.213.0.1", *node_addresses()]
        targets = [f"{h}:{p}" for h in dict.fromkeys(hosts) for p in ports if p != 7711]
        with _client(running).sandboxes.create(network="none", model_endpoint=True) as sb:
            reached = json.loads(py(sb, SCAN, json.dumps(targets)))
            assert not [t for t, r in reached.items() if r == "ok"], reached
            assert host.accepted == 0
            # ask the endpoint to go elsewhere: every answer is the model proxy's own
            gateway = (running.home / "run" / "gateway.addr").read_text().strip()
            asks = [
                f"CONNECT 127.0.0.1:{host.port} HTTP/1.1\r\nHost: 127.0.0.1:{host.port}\r\n\r\n",
                f"GET http://127.0.0.1:{host.port}/ HTTP/1.1\r\nHost: 127.0.0.1:{host.port}\r\n"
                "Connection: close\r\n\r\n",
                f"GET http://10.213.0.1:{host.port}/ HTTP/1.0\r\n\r\n",
                f"POST /v1/sessions HTTP/1.1\r\nHost: {gateway}\r\nContent-Length: 2\r\n"
                "Connection: close\r\n\r\n{}",
            ]
            for ask in asks:
                answer = py(sb, RAW, ask)
                status = answer.split("\r\n", 1)[0]
                assert status.startswith("HTTP/1.") and status[9] == "4", (ask, answer[:300])
                assert "host-root" not in answer
            sessions = py(sb, RAW, asks[-1])
            assert "API_KEY_MISSING" in sessions, sessions[:300]  # the proxy's refusal
            assert host.accepted == 0
    finally:
        host.close()


def test_another_sandbox_is_out_of_reach_and_internet_sandboxes_have_the_endpoint_too(
    stack: tuple[Stack, ScriptedUpstream],
) -> None:
    running, _ = stack
    session = _session(running)
    client = _client(running)
    proxy_port = (running.home / "run" / "modelproxy.addr").read_text().strip().rsplit(":", 1)[1]
    with (
        client.sandboxes.create(network="none", model_endpoint=True) as walled,
        client.sandboxes.create(network="internet", model_endpoint=True) as open_sb,
    ):
        open_sb.exec("setsid python3 -m http.server 8000 >/dev/null 2>&1 </dev/null &")
        where = py(open_sb, "import socket; s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); "
                   "s.connect(('10.213.0.1', 9)); print(s.getsockname()[0])")  # fmt: skip
        assert where.startswith("10.213.")
        reached = json.loads(py(walled, SCAN, json.dumps([f"{where}:8000", f"{where}:7711"])))
        assert set(reached.values()) <= {"OSError", "ConnectionRefusedError"}, reached
        assert "ok" not in reached.values()
        # under policy internet the endpoint serves as well, and the proxy's own port on the
        # node stays closed to the sandbox (the endpoint is the only way)
        answer = _chat(open_sb, session["credential"])
        assert answer["status"] == 200, answer
        direct = [f"{h}:{proxy_port}" for h in ("10.213.0.1", *node_addresses())]
        reached = json.loads(py(open_sb, SCAN, json.dumps(direct)))
        assert "ok" not in reached.values(), reached
        # a policy change keeps the endpoint (it lives on the namespace's loopback)
        open_sb.set_network("none")
        assert _chat(open_sb, session["credential"])["status"] == 200


# Inside: hold argv[1] connections to the endpoint, then ask once more (one Chat call shape);
# prints the status line and body of that answer, then whether the held ones are still open.
FLOOD = """
import json, socket, sys, time
held = [socket.create_connection(("127.0.0.1", 7711), timeout=5) for _ in range(int(sys.argv[1]))]
time.sleep(0.5)
s = socket.create_connection(("127.0.0.1", 7711), timeout=5)
s.sendall(b"POST /s/x/v1/chat/completions HTTP/1.1\\r\\nContent-Length: 2\\r\\n\\r\\n{}")
out = b""
try:
    while chunk := s.recv(65536):
        out += chunk
except OSError:
    pass
burst = []
for _ in range(int(sys.argv[2])):
    try:
        burst.append(socket.create_connection(("127.0.0.1", 7711), timeout=2))
    except OSError:
        pass
time.sleep(1)
print(json.dumps({"answer": out.decode(errors="replace"), "burst": len(burst)}))
"""


def _metric(stack: Stack, name: str, label: str) -> float:
    addr = (stack.home / "run" / "scheduler.metrics.addr").read_text().strip()
    url = addr if addr.startswith("http") else f"http://{addr}"
    token = (stack.home / "secrets" / "metrics-token").read_text().strip()
    scrape = urllib.request.Request(f"{url}/metrics", headers={"Authorization": f"Bearer {token}"})
    with urllib.request.urlopen(scrape, timeout=10) as answer:
        text = answer.read().decode()
    for line in text.splitlines():
        if line.startswith(f"{name}{{") and label in line:
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def test_a_connection_flood_from_one_sandbox_is_capped(
    stack: tuple[Stack, ScriptedUpstream],
) -> None:
    running, _ = stack
    session = _session(running)
    client = _client(running)
    refused_before = _metric(running, "orchard_model_endpoint_connections_total", "refused_cap")
    started = time.monotonic()
    with (
        client.sandboxes.create(network="none", model_endpoint=True) as flooder,
        client.sandboxes.create(network="none", model_endpoint=True) as neighbour,
    ):
        result = json.loads(py(flooder, FLOOD, "4", "200"))
        answer = result["answer"]
        assert answer.startswith("HTTP/1.1 429"), answer[:300]
        assert "MODEL_ENDPOINT_FULL" in answer and "this sandbox has 4" in answer
        # the neighbour (same tenant, its own cap) is served meanwhile
        assert _chat(neighbour, session["credential"])["status"] == 200
    refused = _metric(running, "orchard_model_endpoint_connections_total", "refused_cap")
    seconds = time.monotonic() - started
    # 200 connections over the cap cost the scheduler at most ~20 refusals a second (the
    # listener pauses 50 ms after each), however fast the sandbox connects
    assert refused - refused_before >= 1
    assert (refused - refused_before) / seconds <= 25, (refused - refused_before, seconds)
    assert _metric(running, "orchard_model_endpoint_bytes_total", "to_proxy") > 0


def _child_pid(parent: int, module: str) -> int:
    """The pid of ``orchard up``'s child running ``python -m <module>``."""
    children = Path(f"/proc/{parent}/task/{parent}/children").read_text().split()
    for pid in map(int, children):
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        if module.encode() in argv:
            return pid
    raise AssertionError(f"no {module} child of {parent}")


def test_a_restarted_scheduler_reopens_the_endpoint(stack: tuple[Stack, ScriptedUpstream]) -> None:
    """Last in this module: it kills this stack's scheduler (orchard up restarts it)."""
    running, _ = stack
    session = _session(running)
    client = _client(running)
    with client.sandboxes.create(network="none", model_endpoint=True) as sb:
        assert _chat(sb, session["credential"])["status"] == 200
        scheduler = _child_pid(running.process.pid, "orchard.scheduler")
        os.kill(scheduler, signal.SIGKILL)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                new = _child_pid(running.process.pid, "orchard.scheduler")
                if new != scheduler:
                    client.sandboxes.list()  # served: recovery (backend.list) has run
                    break
            except (AssertionError, OrchardError):
                pass
            time.sleep(0.5)
        else:
            raise AssertionError("the scheduler did not come back")
        assert _chat(sb, session["credential"])["status"] == 200
