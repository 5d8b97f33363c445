"""Hostile clients against the REST/JSON facade (``POST /v1/<Service>/<Method>``) of a real stack.

Malformed JSON, wrong types, unknown fields, huge bodies, wrong content types,
unknown services and methods, path tricks, other verbs, and slow (slowloris)
bodies held open: each gets a 4xx with a JSON error body, nothing changes in
the store, and a control call is served after every batch.
"""

from __future__ import annotations

import http.client
import json
import socket
import time
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.stack import REQUIRES_STACK, Stack, running_stack

from .fuzz.harness import (
    REFUSED_IMAGE_PREFIX,
    RESULTS_DIR,
    fd_count,
    service_pid,
    state_snapshot,
)

pytestmark = [*REQUIRES_STACK, pytest.mark.reliability]


@dataclass
class Rest:
    stack: Stack
    host: str
    port: int
    key: str

    def post(
        self, path: str, body: bytes, content_type: str = "application/json", method: str = "POST"
    ) -> tuple[int, bytes]:
        conn = http.client.HTTPConnection(self.host, self.port, timeout=30)
        try:
            conn.request(
                method,
                path,
                body=body,
                headers={"Authorization": f"Bearer {self.key}", "Content-Type": content_type},
            )
            response = conn.getresponse()
            return response.status, response.read()
        finally:
            conn.close()

    def control(self) -> None:
        status, body = self.post("/v1/SandboxService/ListImages", b"{}")
        assert status == 200, body


@pytest.fixture(scope="module")
def rest(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Rest]:
    with running_stack(tmp_path_factory.mktemp("hostile-rest") / "home") as stack:
        host, port = (stack.home / "run" / "gateway-http.addr").read_text().strip().rsplit(":", 1)
        key = (stack.home / "dev-api-key").read_text().strip()
        yield Rest(stack, host, int(port), key)


def _clear(status: int, body: bytes) -> bool:
    if not (400 <= status < 500 or status == 501):  # 501: UNIMPLEMENTED (a verb other than POST)
        return False
    try:
        error = json.loads(body)["error"]
    except (ValueError, KeyError, TypeError):
        return False
    return bool(error.get("message"))


METHODS = [
    "/v1/SandboxService/CreateSandbox",
    "/v1/SandboxService/GetSandbox",
    "/v1/SandboxService/DeleteSandbox",
    "/v1/ExecutorService/Run",
    "/v1/ExecutorService/ReadFile",
    "/v1/SandboxService/KeepAlive",
]
JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=12), inner, max_size=3)
    ),
    max_leaves=8,
)


def test_random_and_malformed_bodies(rest: Rest) -> None:
    counts = {"calls": 0, "unclear": 0}
    unclear: list[str] = []
    before = state_snapshot(rest.stack.home)

    @settings(
        max_examples=150, deadline=None, database=None, suppress_health_check=list(HealthCheck)
    )
    @given(
        path=st.sampled_from(METHODS),
        body=st.one_of(
            st.binary(max_size=200),
            JSON_VALUES.map(lambda v: json.dumps(v).encode()),
            st.dictionaries(
                st.sampled_from(
                    [
                        "id",
                        "image",
                        "ttl_seconds",
                        "start",
                        "path",
                        "sandbox_id",
                        "resources",
                        "bogus",
                    ]
                ),
                JSON_VALUES,
                max_size=4,
            ).map(lambda v: json.dumps(v).encode()),
        ),
    )
    def one(path: str, body: bytes) -> None:
        if path.endswith("CreateSandbox"):
            # a well-formed create is not an attack: make sure it names a missing image
            # (an empty or null body is the empty message, a valid create: send those elsewhere)
            try:
                value = json.loads(body)
            except ValueError:
                value = None
            if isinstance(value, dict):
                value["image"] = REFUSED_IMAGE_PREFIX
                body = json.dumps(value).encode()
            else:
                path = "/v1/SandboxService/GetSandbox"
        status, answer = rest.post(path, body)
        counts["calls"] += 1
        if status != 200 and not _clear(status, answer):
            counts["unclear"] += 1
            unclear.append(f"{path} {body[:80]!r}: {status} {answer[:200]!r}")

    one()
    tricks = [
        ("POST", "/v1/NoSuchService/Method", b"{}", "application/json"),
        ("POST", "/v1/SandboxService/NoSuchMethod", b"{}", "application/json"),
        ("POST", "/v1/SandboxService/../../etc/passwd", b"{}", "application/json"),
        ("POST", "/v1/SandboxService/%2e%2e/ListImages", b"{}", "application/json"),
        ("POST", "/v1//SandboxService//ListImages", b"{}", "application/json"),
        (
            "POST",
            "/v1/ExecutorService/Upload",
            b"{}",
            "application/json",
        ),  # client streaming: no JSON form
        ("GET", "/v1/SandboxService/ListImages", b"", "application/json"),
        ("PUT", "/v1/SandboxService/ListImages", b"{}", "application/json"),
        ("POST", "/v1/SandboxService/GetSandbox", b"<xml/>", "application/xml"),
        ("POST", "/v1/SandboxService/GetSandbox", b"id=x", "application/x-www-form-urlencoded"),
        ("POST", "/v1/SandboxService/GetSandbox", b'{"id": 5}', "application/json"),
        (
            "POST",
            "/v1/SandboxService/KeepAlive",
            b'{"id": "x", "ttl_seconds": "99999999999999999999999"}',
            "application/json",
        ),
        ("POST", "/v1/SandboxService/GetSandbox", b'{"id": "x"' * 1000, "application/json"),
        (
            "POST",
            "/v1/SandboxService/GetSandbox",
            b"[" * 100_000 + b"]" * 100_000,
            "application/json",
        ),
        (
            "POST",
            "/v1/SandboxService/GetSandbox",
            b'{"id": "' + b"a" * (65 << 20) + b'"}',
            "application/json",
        ),
    ]
    for verb, path, body, content_type in tricks:
        status, answer = rest.post(path, body, content_type, verb)
        counts["calls"] += 1
        if not (
            _clear(status, answer)
            or (status in (404, 405, 413) and path != "/v1/SandboxService/GetSandbox")
        ):
            counts["unclear"] += 1
            unclear.append(f"{verb} {path} {body[:60]!r}: {status} {answer[:200]!r}")
        rest.control()
    assert state_snapshot(rest.stack.home) == before
    result = {"name": "rest-bodies", **counts, "unclear_examples": unclear[:10]}
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    (RESULTS_DIR / "rest-bodies.json").write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result))
    assert not unclear, unclear[:5]


def test_slow_bodies_are_held_cheaply(rest: Rest) -> None:
    """50 slowloris clients: headers promise 1 MB, then 1 byte every 0.5 s, for 6 s (bounded).
    Others are served meanwhile; the gateway's fds go back when they leave."""
    gateway_pid = service_pid(rest.stack.process.pid, "orchard.gateway")
    fds_before = fd_count(gateway_pid)
    slow = []
    for _ in range(50):
        s = socket.create_connection((rest.host, rest.port), timeout=5)
        s.sendall(
            b"POST /v1/SandboxService/ListImages HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            + f"Authorization: Bearer {rest.key}\r\nContent-Length: 1000000\r\n\r\n".encode()
        )
        slow.append(s)
    served = 0
    end = time.monotonic() + 6
    try:
        while time.monotonic() < end:
            for s in slow:
                s.sendall(b" ")
            rest.control()
            served += 1
            time.sleep(0.5)
        fds_held = fd_count(gateway_pid)
    finally:
        for s in slow:
            s.close()
    time.sleep(1.0)
    fds_after = fd_count(gateway_pid)
    result = {
        "name": "rest-slowloris",
        "slow_clients": len(slow),
        "control_calls_served": served,
        "gateway_fds": [fds_before, fds_held, fds_after],
    }
    (RESULTS_DIR / "rest-slowloris.json").write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result))
    assert served >= 8
    assert fds_after <= fds_before + 5
