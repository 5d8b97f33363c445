"""The REST/JSON front, driven with curl exactly as docs/rest.md shows it."""

from __future__ import annotations

import base64
import json
import shutil
import subprocess

import pytest

from .conftest import GatewayStack

pytestmark = [
    pytest.mark.runc,
    pytest.mark.skipif(shutil.which("curl") is None, reason="needs curl"),
]


def curl(
    gw: GatewayStack, path: str, body: object | None, key: str | None, *headers: str
) -> tuple[int, dict[str, str], str]:
    args = ["curl", "-sS", "-i", "-X", "POST", f"{gw.http}{path}"]
    if key is not None:
        args += ["-H", f"Authorization: Bearer {key}"]
    for header in headers:
        args += ["-H", header]
    if body is not None:
        args += ["-H", "Content-Type: application/json", "-d", json.dumps(body)]
    out = subprocess.run(args, capture_output=True, text=True, timeout=60, check=True).stdout
    head, _, text = out.partition("\n\n")  # text mode turned CRLF into LF
    status = int(head.split()[1])
    fields = dict(
        (k.strip().lower(), v.strip())
        for k, _, v in (line.partition(":") for line in head.splitlines()[1:])
    )
    return status, fields, text


def test_rest_round_trip_and_errors(gw: GatewayStack) -> None:
    key = gw.new_tenant("rest-user")
    status, _, text = curl(gw, "/v1/SandboxService/CreateSandbox", {"labels": {"via": "curl"}}, key)
    assert status == 200, text
    sandbox = json.loads(text)
    sid = sandbox["id"]
    assert sandbox["state"] == "READY" and sandbox["tenant"] == "rest-user"
    try:
        status, _, text = curl(
            gw,
            "/v1/ExecutorService/Run",
            {"start": {"sandbox_id": sid, "shell": "echo hello; echo oops >&2; exit 3"}},
            key,
        )
        assert status == 200, text
        result = json.loads(text)
        assert base64.b64decode(result["stdout"]) == b"hello\n"
        assert base64.b64decode(result["stderr"]) == b"oops\n"
        assert result["status"]["exit_code"] == 3
        # A server-streaming call answers NDJSON, one message per line.
        status, fields, text = curl(
            gw, "/v1/ExecutorService/ReadFile", {"sandbox_id": sid, "path": "/etc/os-release"}, key
        )
        assert status == 200 and fields["content-type"].startswith("application/x-ndjson")
        chunks = [json.loads(line) for line in text.splitlines()]
        assert b"Debian" in b"".join(base64.b64decode(c.get("data", "")) for c in chunks)
        status, _, text = curl(gw, "/v1/SandboxService/ListSandboxes", {}, key)
        assert [s["id"] for s in json.loads(text)["sandboxes"]] == [sid]

        # Errors: status, JSON body with code, reason, fault, message.
        status, _, text = curl(gw, "/v1/SandboxService/ListSandboxes", {}, None)
        assert status == 401 and json.loads(text)["error"]["reason"] == "API_KEY_INVALID"
        other = gw.new_tenant("rest-other")
        for path, body in (
            ("/v1/SandboxService/GetSandbox", {"id": sid}),
            ("/v1/ExecutorService/Run", {"start": {"sandbox_id": sid, "argv": ["id"]}}),
        ):
            status, _, text = curl(gw, path, body, other)
            error = json.loads(text)["error"]
            assert (status, error["code"], error["reason"]) == (
                404,
                "NOT_FOUND",
                "SANDBOX_NOT_FOUND",
            ), text
            assert error["fault"] == "client" and error["message"]
        status, _, text = curl(gw, "/v1/SandboxService/CreateSandbox", {"nope": 1}, key)
        assert status == 400 and json.loads(text)["error"]["code"] == "INVALID_ARGUMENT"
        status, _, text = curl(
            gw,
            "/v1/ExecutorService/ReadFile",
            {"sandbox_id": sid, "path": "/../../etc/shadow-nope"},
            key,
        )
        assert status in (400, 404) and json.loads(text)["error"]["reason"].startswith("PATH")
        status, _, text = curl(gw, "/v1/NoService/Nope", {}, key)
        assert status == 404 and "error" in json.loads(text)
    finally:
        status, _, text = curl(gw, "/v1/SandboxService/DeleteSandbox", {"id": sid}, key)
        assert status == 200 and json.loads(text) == {}


def test_rest_quota_answers_429_with_retry_after(gw: GatewayStack) -> None:
    key = gw.new_tenant("rest-rate", create_rate=0.2, create_burst=1)
    made = []
    try:
        status, _, text = curl(gw, "/v1/SandboxService/CreateSandbox", {}, key)
        assert status == 200
        made.append(json.loads(text)["id"])
        status, fields, text = curl(gw, "/v1/SandboxService/CreateSandbox", {}, key)
        assert status == 429
        error = json.loads(text)["error"]
        assert error["code"] == "RESOURCE_EXHAUSTED" and error["reason"] == "QUOTA_EXCEEDED"
        assert 0 < error["retry_after"] <= 5 and int(fields["retry-after"]) >= 1
    finally:
        for sid in made:
            curl(gw, "/v1/SandboxService/DeleteSandbox", {"id": sid}, key)


def test_rest_file_operations_and_signal_exit_codes(gw: GatewayStack) -> None:
    """The file RPCs and a signalled command over REST, as docs/rest.md shows them."""
    key = gw.new_tenant("rest-files")
    status, _, text = curl(gw, "/v1/SandboxService/CreateSandbox", {}, key)
    assert status == 200, text
    sid = json.loads(text)["id"]
    try:
        status, _, text = curl(
            gw,
            "/v1/ExecutorService/Run",
            {"start": {"sandbox_id": sid, "shell": "kill -TERM $$"}},
            key,
        )
        assert status == 200 and json.loads(text)["status"] == {
            "exit_code": -15, "signal": 15, "duration_seconds": json.loads(text)["status"]["duration_seconds"]
        }  # fmt: skip
        status, _, text = curl(
            gw,
            "/v1/ExecutorService/MakeDir",
            {"sandbox_id": sid, "path": "/work/r/s", "parents": True},
            key,
        )
        assert (status, json.loads(text)) == (200, {"created": True}), text
        status, _, text = curl(
            gw, "/v1/ExecutorService/ListDir", {"sandbox_id": sid, "path": "/work", "depth": 2}, key
        )
        entries = json.loads(text)["entries"]
        assert [(e["path"], e["type"]) for e in entries] == [
            ("/work/r", "FILE_TYPE_DIRECTORY"), ("/work/r/s", "FILE_TYPE_DIRECTORY"),
        ]  # fmt: skip
        status, _, text = curl(
            gw,
            "/v1/ExecutorService/Rename",
            {"sandbox_id": sid, "source": "/work/r/s", "destination": "/work/t"},
            key,
        )
        assert status == 200, text
        status, _, text = curl(
            gw, "/v1/ExecutorService/Stat", {"sandbox_id": sid, "path": "/work/r/s"}, key
        )
        error = json.loads(text)["error"]
        assert (status, error["reason"]) == (404, "PATH_NOT_FOUND")
        status, _, text = curl(
            gw,
            "/v1/ExecutorService/Remove",
            {"sandbox_id": sid, "path": "/work", "recursive": True},
            key,
        )
        assert (status, json.loads(text)) == (200, {"removed": "3"}), text
    finally:
        curl(gw, "/v1/SandboxService/DeleteSandbox", {"id": sid}, key)
