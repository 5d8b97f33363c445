"""A small OpenEnv environment server on Python's stdlib alone (test data: it runs
inside the sandbox, uploaded by ``tests/integrations/test_openenv.py``).

Why not OpenEnv's own server (``openenv.core.env_server``): it needs FastAPI, uvicorn,
pydantic (compiled pydantic-core) and, through its MCP support, fastmcp and their
trees, none of which the default image has and which a sandbox with network ``none``
cannot install; importing it with uvicorn on this machine loads 513 MB of packages
(gradio, pandas, pyarrow among them), too much to upload into every test's sandbox. This server speaks the same wire contract as ``HTTPEnvServer``
(openenv-core 0.3, ``openenv/core/env_server/http_server.py``), which is what
OpenEnv's clients check:

- ``GET /health`` -> ``{"status": "healthy"}``;
- ``POST /reset`` / ``POST /step`` (``{"action": {...}}``) -> ``{"observation",
  "reward", "done"}``; ``GET /state`` -> the state;
- ``/ws``: a WebSocket (RFC 6455, text frames) carrying ``{"type": "reset"|"step"|
  "state"|"close", "data": ...}`` and answering ``{"type": "observation"|"state",
  "data": ...}`` or ``{"type": "error", "data": {"message", "code"}}``, one
  environment per connection, as ``EnvClient`` uses it.

The environment: a counter towards a target. ``reset(target=N)`` starts at 0;
``step({"add": k})`` adds k; the reward is ``-|target - count|`` and the episode is
done once the count reaches the target.

Usage: ``python3 openenv_server.py PORT``.
"""

from __future__ import annotations

import base64
import hashlib
import http.server
import json
import struct
import sys
import uuid

WS_GUID = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"


class Counter:
    def __init__(self) -> None:
        self.reset({})

    def reset(self, data):
        self.target = int(data.get("target", 3))
        self.count = 0
        self.steps = 0
        self.episode_id = str(data.get("episode_id") or uuid.uuid4())
        return self._result(reward=None)

    def step(self, action):
        if not isinstance(action.get("add"), int):
            raise ValueError(f"action needs an integer 'add': {action!r}")
        self.count += action["add"]
        self.steps += 1
        return self._result(reward=-abs(self.target - self.count))

    def state(self):
        return {
            "episode_id": self.episode_id,
            "step_count": self.steps,
            "count": self.count,
            "target": self.target,
        }

    def _result(self, reward):
        done = self.count >= self.target
        observation = {"count": self.count, "target": self.target}
        return {"observation": observation, "reward": reward, "done": done}


HTTP_ENV = Counter()


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_GET(self):
        if self.path == "/health":
            return self._json(200, {"status": "healthy"})
        if self.path == "/state":
            return self._json(200, HTTP_ENV.state())
        if self.path == "/ws" and self.headers.get("Upgrade", "").lower() == "websocket":
            return self._websocket()
        return self._json(404, {"detail": "Not Found"})

    def do_POST(self):
        length = int(self.headers.get("Content-Length") or 0)
        try:
            body = json.loads(self.rfile.read(length) or b"{}")
            if self.path == "/reset":
                return self._json(200, HTTP_ENV.reset(body))
            if self.path == "/step":
                return self._json(200, HTTP_ENV.step(body.get("action") or {}))
        except ValueError as exc:
            return self._json(422, {"detail": str(exc)})
        return self._json(404, {"detail": "Not Found"})

    def _json(self, code, payload):
        data = json.dumps(payload).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    # ---- WebSocket ---------------------------------------------------------------

    def _websocket(self):
        key = self.headers["Sec-WebSocket-Key"]
        accept = base64.b64encode(hashlib.sha1((key + WS_GUID).encode()).digest()).decode()
        self.send_response(101, "Switching Protocols")
        self.send_header("Upgrade", "websocket")
        self.send_header("Connection", "Upgrade")
        self.send_header("Sec-WebSocket-Accept", accept)
        self.end_headers()
        self.close_connection = True
        env = Counter()
        while True:
            opcode, payload = self._read_frame()
            if opcode == 0x8:  # close: answer it and end
                self._send_frame(0x8, payload[:2])
                return
            if opcode == 0x9:  # ping
                self._send_frame(0xA, payload)
                continue
            if opcode != 0x1:
                continue  # pongs (and binary, which the client never sends)
            message = json.loads(payload)
            kind = message.get("type")
            try:
                if kind == "reset":
                    reply = {"type": "observation", "data": env.reset(message.get("data") or {})}
                elif kind == "step":
                    reply = {"type": "observation", "data": env.step(message.get("data") or {})}
                elif kind == "state":
                    reply = {"type": "state", "data": env.state()}
                elif kind == "close":
                    continue  # the client's close frame follows
                else:
                    reply = _error(f"Unknown message type: {kind}", "UNKNOWN_TYPE")
            except ValueError as exc:
                reply = _error(str(exc), "VALIDATION_ERROR")
            self._send_frame(0x1, json.dumps(reply).encode())

    def _read_frame(self):
        head = self._read(2)
        opcode, length = head[0] & 0x0F, head[1] & 0x7F
        if length == 126:
            (length,) = struct.unpack("!H", self._read(2))
        elif length == 127:
            (length,) = struct.unpack("!Q", self._read(8))
        mask = self._read(4) if head[1] & 0x80 else b"\0\0\0\0"
        data = self._read(length)
        return opcode, bytes(b ^ mask[i % 4] for i, b in enumerate(data))

    def _read(self, n):
        data = self.rfile.read(n)
        if len(data) != n:
            raise ConnectionError("the client went away")
        return data

    def _send_frame(self, opcode, payload):
        n = len(payload)
        if n < 126:
            head = struct.pack("!BB", 0x80 | opcode, n)
        elif n < 1 << 16:
            head = struct.pack("!BBH", 0x80 | opcode, 126, n)
        else:
            head = struct.pack("!BBQ", 0x80 | opcode, 127, n)
        self.wfile.write(head + payload)


def _error(message, code):
    return {"type": "error", "data": {"message": message, "code": code}}


if __name__ == "__main__":
    port = int(sys.argv[1])
    server = http.server.ThreadingHTTPServer(("127.0.0.1", port), Handler)
    print(f"serving on 127.0.0.1:{port}", flush=True)
    server.serve_forever()
