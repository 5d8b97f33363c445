"""The in-sandbox services as a real process on the host, for the tests that need no sandbox.

``box_process(root)`` starts ``launch.py serve`` (the same file a sandbox runs) with this
venv's Python (``-I``, as in the sandbox; the venv has the ``mcp`` and tau2 packages the
sandbox gets from the runtime tree) on a free loopback port, hands it the admin secret on
stdin, and stops it (by its pid) on exit. ``BoxProcess`` speaks its HTTP API with urllib.
"""

from __future__ import annotations

import json
import secrets
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from orchard.recipes.claw.services import runtime
from orchard.recipes.claw.services.box.wire import sign_request, sign_response

LAUNCH = runtime.BOX / "launch.py"


@dataclass
class Answer:
    status: int
    body: bytes
    headers: Mapping[str, str]

    @property
    def json(self) -> Any:
        return json.loads(self.body)


@dataclass
class BoxProcess:
    process: subprocess.Popen[bytes]
    port: int
    secret: bytes

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def request(
        self, method: str, path: str, body: bytes | None = None, headers: Mapping[str, str] = {}
    ) -> Answer:
        request = urllib.request.Request(
            self.base + path, data=body, method=method,
            headers={"Content-Type": "application/json", **headers},
        )  # fmt: skip
        try:
            with urllib.request.urlopen(request, timeout=30) as answer:
                return Answer(answer.status, answer.read(), dict(answer.headers))
        except urllib.error.HTTPError as err:
            return Answer(err.code, err.read(), dict(err.headers))

    def call(self, name: str, arguments: Any = None, raw: bytes | None = None) -> Answer:
        body = raw if raw is not None else json.dumps(arguments or {}).encode()
        return self.request("POST", f"/v1/tools/{name}", body)

    def ok(self, tool: str, /, **arguments: Any) -> Any:
        answer = self.call(tool, arguments)
        assert answer.status == 200 and answer.json["ok"], (tool, answer.status, answer.body)
        return answer.json["result"]

    def error(self, name: str, arguments: Any, code: str) -> str:
        answer = self.call(name, arguments)
        assert not answer.json["ok"], (name, answer.body)
        assert answer.json["error"]["code"] == code, (name, answer.body)
        return str(answer.json["error"]["message"])

    def admin(self, op: str, payload: Mapping[str, Any], nonce: str | None = None) -> Answer:
        body = json.dumps(payload).encode()
        nonce = nonce or secrets.token_hex(12)
        answer = self.request(
            "POST", f"/admin/{op}", body,
            {"X-Claw-Nonce": nonce, "X-Claw-Auth": sign_request(self.secret, op, nonce, body)},
        )  # fmt: skip
        if answer.status != 401:
            assert answer.headers["X-Claw-Signature"] == sign_response(
                self.secret, nonce, answer.body
            )
        return answer

    def reset(self, fixtures: Mapping[str, Any]) -> Any:
        answer = self.admin("reset", {"fixtures": fixtures})
        assert answer.status == 200, answer.body
        return answer.json

    def audit(self) -> list[dict[str, Any]]:
        answer = self.admin("audit", {})
        assert answer.status == 200, answer.body
        return list(answer.json["entries"])

    def state(self) -> dict[str, Any]:
        answer = self.admin("state", {})
        assert answer.status == 200, answer.body
        return dict(answer.json["state"])


@contextmanager
def box_process(*args: str) -> Iterator[BoxProcess]:
    secret = secrets.token_bytes(32)
    process = subprocess.Popen(
        [sys.executable, "-I", str(LAUNCH), "serve", "--port", "0", *args],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE,
    )  # fmt: skip
    try:
        assert process.stdin is not None and process.stdout is not None
        process.stdin.write(secret.hex().encode() + b"\n")
        process.stdin.close()
        line = process.stdout.readline()
        assert line, "the services exited before listening"
        yield BoxProcess(process, int(json.loads(line)["listening"]), secret)
    finally:
        process.kill()
        process.wait(10)
        if process.stdout is not None:
            process.stdout.close()
