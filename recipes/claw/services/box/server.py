"""The in-sandbox HTTP server of the Claw services (stdlib only: the image's ``python3``).

Agent side (anyone in the sandbox may call; every call is audited):

- ``GET /health``: ``{"ok", "services", "pid", "calls"}``;
- ``GET /v1/tools``: the OpenAI function tools of the offered services;
- ``POST /v1/tools/<name>`` with the arguments as a JSON object, or ``POST /v1/call`` with
  ``{"name", "arguments"}``: ``{"ok": true, "result": ...}`` (200) or ``{"ok": false,
  "error": {"code", "message"}}`` (400 bad arguments, 404 unknown tool or missing item,
  409 conflict / rejected, 413 too large, 429 audit full, 500 a bug of ours).
  ``X-Claw-Channel: mcp`` marks a call the MCP server forwards (the channel is a label,
  not a proof).

Driver side, ``POST /admin/<reset|audit|state>``: refused (401) without ``X-Claw-Nonce``
and ``X-Claw-Auth`` = HMAC-SHA256 of the request under the secret the driver wrote on our
stdin at start (a nonce is accepted once); the answer carries ``X-Claw-Signature``, the
HMAC of the nonce and the body, so the driver knows it is ours. The process makes itself
non-dumpable before it reads the secret: root in the sandbox, without ``CAP_SYS_PTRACE``,
cannot read our memory, environment or descriptors.

Bounds: bodies at most 2 MiB (413; no chunked bodies: 411), 16 requests at once (503),
15 s of socket silence per connection.

Why ``http.server``: the agent-facing API is a dozen JSON routes on loopback; a framework
would have to be importable in the image before the first call, and starts slower.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import hmac
import json
import os
import sys
import threading
import time
from collections.abc import Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from .core import MAX_AUDIT
from .stack import Stack
from .wire import sign_request, sign_response

MAX_BODY = 2 << 20
MAX_INFLIGHT = 16
IDLE_SECONDS = 15
LINGER_MAX_BYTES = 8 << 20  # a refused body read and dropped before the close, at most
LINGER_SECONDS = 2.0
MAX_NONCES = 100_000
PR_SET_DUMPABLE = 4

_STATUS = {
    "invalid_arguments": 400,
    "unknown_tool": 404,
    "not_found": 404,
    "forbidden": 403,
    "conflict": 409,
    "rejected": 409,
    "too_large": 413,
    "audit_full": 429,
    "internal": 500,
}


class Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 64

    def __init__(self, address: tuple[str, int], secret: bytes, stack: Stack) -> None:
        super().__init__(address, Handler)
        self.secret = secret
        self.stack = stack
        self.inflight = threading.BoundedSemaphore(MAX_INFLIGHT)
        self.nonces: set[str] = set()
        self.nonce_lock = threading.Lock()

    def fresh_nonce(self, nonce: str) -> bool:
        with self.nonce_lock:
            if nonce in self.nonces or len(self.nonces) >= MAX_NONCES:
                return False
            self.nonces.add(nonce)
            return True


class Handler(BaseHTTPRequestHandler):
    server: Server
    timeout = IDLE_SECONDS
    protocol_version = "HTTP/1.1"
    server_version = "claw-services/1"

    def log_message(self, format: str, *args: Any) -> None:  # quiet: the audit log is the record
        return

    # ---- plumbing -----------------------------------------------------------------

    def _send(self, status: int, payload: Any, headers: Mapping[str, str] | None = None) -> bytes:
        body = json.dumps(payload, ensure_ascii=False, default=str).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self.end_headers()
        self.wfile.write(body)
        return body

    def _error(self, status: int, code: str, message: str) -> None:
        self._send(status, {"ok": False, "error": {"code": code, "message": message}})

    def _body(self) -> bytes | None:
        if self.headers.get("Transfer-Encoding"):
            self._error(411, "length_required", "send a Content-Length, not a chunked body")
            return None
        try:
            length = int(self.headers.get("Content-Length") or 0)
        except ValueError:
            self._error(400, "invalid_request", "Content-Length is not a number")
            return None
        if length < 0 or length > MAX_BODY:
            self.close_connection = True
            self._error(413, "too_large", f"bodies are at most {MAX_BODY} bytes")
            self._discard(length)
            return None
        return self.rfile.read(length) if length else b""

    def _discard(self, length: int) -> None:
        """Read (and drop) a refused body before the connection closes, bounded in bytes and
        time: closing with unread bytes makes the kernel send a reset, which can reach the
        client before the answer does, so it would see "connection reset" instead of 413."""
        left = min(max(length, 0), LINGER_MAX_BYTES)
        deadline = time.monotonic() + LINGER_SECONDS
        with contextlib.suppress(OSError):
            self.connection.settimeout(LINGER_SECONDS)
            while left > 0 and time.monotonic() < deadline:
                chunk = self.rfile.read1(min(left, 1 << 16))
                if not chunk:
                    break
                left -= len(chunk)

    @staticmethod
    def _json(body: bytes) -> tuple[bool, Any]:
        try:
            return True, json.loads(body.decode("utf-8")) if body else {}
        except (ValueError, UnicodeDecodeError, RecursionError) as err:
            return False, f"the body is not JSON: {str(err)[:200]}"

    def _guarded(self, method: Any) -> None:
        if not self.server.inflight.acquire(blocking=False):
            self.close_connection = True
            self._error(503, "busy", f"at most {MAX_INFLIGHT} requests at once")
            with contextlib.suppress(ValueError):
                self._discard(int(self.headers.get("Content-Length") or 0))
            return
        try:
            method()
        finally:
            self.server.inflight.release()

    # ---- routes ---------------------------------------------------------------------

    def do_GET(self) -> None:
        self._guarded(self._get)

    def do_POST(self) -> None:
        self._guarded(self._post)

    def _get(self) -> None:
        path = self.path.split("?", 1)[0]
        if path == "/health":
            self._send(200, self.server.stack.health())
        elif path == "/v1/tools":
            self._send(200, {"tools": self.server.stack.specs()})
        else:
            self._error(404, "no_route", f"no route GET {path[:200]}; see GET /v1/tools")

    def _post(self) -> None:
        path = self.path.split("?", 1)[0]
        body = self._body()
        if body is None:
            return
        if path.startswith("/admin/"):
            self._admin(path[len("/admin/") :], body)
            return
        channel = self.headers.get("X-Claw-Channel") or "http"
        channel = channel if channel in ("mcp", "driver") else "http"
        ok, value = self._json(body)
        if path == "/v1/call":
            if not ok or not isinstance(value, dict) or not isinstance(value.get("name"), str):
                self._error(400, "invalid_request", 'send {"name": <tool>, "arguments": {...}}')
                return
            name, arguments = value["name"], value.get("arguments", {})
        elif path.startswith("/v1/tools/"):
            name, arguments = path[len("/v1/tools/") :], value if ok else None
            if not ok:
                arguments = {"<unparsed body>": body[:2000].decode("utf-8", "replace")}
        else:
            self._error(404, "no_route", f"no route POST {path[:200]}; see GET /v1/tools")
            return
        if isinstance(arguments, str):  # a model that sends the arguments as a JSON string
            parsed, decoded = self._json(arguments.encode())
            arguments = decoded if parsed else arguments
        answer = self.server.stack.call(name, arguments, channel, parse_error=None if ok else value)
        status = 200 if answer["ok"] else _STATUS.get(answer["error"]["code"], 400)
        self._send(status, answer)

    def _admin(self, op: str, body: bytes) -> None:
        nonce = self.headers.get("X-Claw-Nonce") or ""
        auth = self.headers.get("X-Claw-Auth") or ""
        expected = sign_request(self.server.secret, op, nonce, body)
        if not nonce or len(nonce) > 200 or not hmac.compare_digest(auth, expected):
            self._error(401, "unauthorized", "admin calls are the driver's")
            return
        if not self.server.fresh_nonce(nonce):
            self._error(401, "replayed", "this nonce was used already")
            return
        ok, value = self._json(body)
        if not ok or not isinstance(value, dict):
            self._signed(
                nonce,
                400,
                {"ok": False, "error": {"code": "invalid_request", "message": str(value)}},
            )
            return
        try:
            if op == "reset":
                payload: dict[str, Any] = {
                    "ok": True,
                    **self.server.stack.reset(value.get("fixtures")),
                }
            elif op == "audit":
                payload = {"ok": True, **self.server.stack.audit()}
            elif op == "state":
                payload = {"ok": True, "state": self.server.stack.state()}
            else:
                self._signed(
                    nonce, 404, {"ok": False, "error": {"code": "no_route", "message": op[:100]}}
                )
                return
        except (ValueError, KeyError, TypeError, RuntimeError, OSError, ImportError) as err:
            message = f"{type(err).__name__}: {str(err)[:2000]}"
            self._signed(
                nonce, 400, {"ok": False, "error": {"code": "admin_failed", "message": message}}
            )
            return
        self._signed(nonce, 200, payload)

    def _signed(self, nonce: str, status: int, payload: Any) -> None:
        body = json.dumps(payload, ensure_ascii=False, default=str).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.send_header("X-Claw-Signature", sign_response(self.server.secret, nonce, body))
        self.end_headers()
        self.wfile.write(body)


def _not_dumpable() -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_DUMPABLE, 0) failed")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="The Claw mock services (in the sandbox).")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--max-audit", type=int, default=MAX_AUDIT, help="calls the log holds")
    args = parser.parse_args(argv)
    _not_dumpable()
    line = sys.stdin.buffer.readline(200).strip()
    try:
        secret = bytes.fromhex(line.decode())
    except ValueError:
        secret = b""
    if len(secret) < 16:
        print(
            "claw-services: expected the secret (hex) on the first line of stdin", file=sys.stderr
        )
        raise SystemExit(2)
    sys.stdin.close()
    server = Server((args.host, args.port), secret, Stack(max(1, args.max_audit)))
    print(json.dumps({"listening": server.server_address[1], "pid": os.getpid()}), flush=True)
    server.serve_forever(poll_interval=0.5)
