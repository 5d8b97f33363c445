"""An OpenAI-compatible chat server on loopback with scripted answers.

A stand-in for a real model (the tests say so): it speaks the real HTTP
protocol the ``openai`` client uses (``POST /v1/chat/completions``), so the
judge's retries, repair, timeouts and concurrency limit run for real; only
the answers are scripted. Each request takes the next script entry:

- ``("ok", text)``: 200 with ``text`` as the assistant message;
- ``("slow", seconds, text)``: the same after a delay;
- ``("status", code)``: that HTTP error (429 comes with ``retry-after: 0``).

When the script is exhausted the last entry repeats. ``requests`` records
every request body; ``max_in_flight`` the most requests served at once.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

Entry = tuple[Any, ...]


class ScriptedLLM:
    def __init__(self, script: list[Entry]) -> None:
        self.script = list(script)
        self.requests: list[dict[str, Any]] = []
        self.in_flight = 0
        self.max_in_flight = 0
        self._lock = threading.Lock()
        self.base_url = ""

    def next_entry(self, body: dict[str, Any]) -> Entry:
        with self._lock:
            self.requests.append(body)
            self.in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self.in_flight)
            return self.script.pop(0) if len(self.script) > 1 else self.script[0]

    def done(self) -> None:
        with self._lock:
            self.in_flight -= 1


def _handler(llm: ScriptedLLM) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:
            pass

        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers.get("content-length", "0"))))
            entry = llm.next_entry(body)
            try:
                if entry[0] == "status":
                    payload = json.dumps(
                        {"error": {"message": f"scripted {entry[1]}", "type": "scripted"}}
                    ).encode()
                    self.send_response(entry[1])
                    if entry[1] == 429:
                        self.send_header("retry-after", "0")
                else:
                    if entry[0] == "slow":
                        time.sleep(entry[1])
                    text = entry[-1]
                    payload = json.dumps({
                        "id": "chatcmpl-scripted", "object": "chat.completion", "created": int(time.time()),
                        "model": body.get("model", "scripted"),
                        "choices": [{"index": 0, "finish_reason": "stop",
                                     "message": {"role": "assistant", "content": text}}],
                        "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
                    }).encode()  # fmt: skip
                    self.send_response(200)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)
            except (BrokenPipeError, ConnectionResetError):
                pass  # the client gave up (timeout): fine
            finally:
                llm.done()

    return Handler


@contextmanager
def scripted_llm(script: list[Entry]) -> Iterator[ScriptedLLM]:
    llm = ScriptedLLM(script)
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(llm))
    server.daemon_threads = True
    llm.base_url = f"http://127.0.0.1:{server.server_address[1]}/v1"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield llm
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)
