"""Overhead of the recording model proxy, side by side with LiteLLM's proxy, in one run.

Three processes answer the same Chat calls: a scripted upstream (aiohttp, its own process,
answering at once with token ids, streamed or not), the model proxy (``python -m
orchard.modelproxy``, recording every call, ``--upstream-kind vllm``), and LiteLLM's proxy
(the ``litellm`` CLI, a real process, pointed at the same upstream). The client (stdlib
``http.client``, one keep-alive connection per path) calls the three paths in alternating
rounds, so the shared machine's noise falls on each alike, and prints JSON: p50 / p90 per
call and time to the first streamed content chunk, and what each proxy adds over direct.

    .venv/bin/python loadtest/bench_modelproxy.py [--calls 300] [--litellm PATH]

LiteLLM is not a dependency of the project (its proxy pulls a large tree): install it in
its own venv (``python3 -m venv /tmp/litellm && /tmp/litellm/bin/pip install
'litellm[proxy]'``) and pass ``--litellm /tmp/litellm/bin/litellm``; without it the LiteLLM
figures are ``null`` and say why.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from concurrent import futures
from pathlib import Path
from typing import Any

BODY_TEXT = "The bug is in add(): it subtracts. Fix: return a + b."
LITELLM_KEY = "sk-bench-" + os.urandom(16).hex()
PIECES = [BODY_TEXT[i : i + 6] for i in range(0, len(BODY_TEXT), 6)]


def serve_upstream(port: int) -> None:
    """The scripted upstream (run in its own process): vLLM-shaped answers, no delay."""
    from aiohttp import web

    async def chat(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        ids = list(range(100, 100 + len(PIECES)))
        head = {"id": "chatcmpl-b", "created": 0, "model": "scripted"}
        if not body.get("stream"):
            choice: dict[str, Any] = {"index": 0, "finish_reason": "stop",
                                      "message": {"role": "assistant", "content": BODY_TEXT}}  # fmt: skip
            answer: dict[str, Any] = {**head, "object": "chat.completion", "choices": [choice],
                                      "usage": {"prompt_tokens": 20, "completion_tokens": len(ids), "total_tokens": 20 + len(ids)}}  # fmt: skip
            if body.get("return_token_ids"):
                choice["token_ids"] = ids
                answer["prompt_token_ids"] = list(range(20))
            return web.json_response(answer)
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        for i, piece in enumerate(PIECES):
            part: dict[str, Any] = {"index": 0, "delta": {"content": piece}, "finish_reason": None}
            chunk: dict[str, Any] = {**head, "object": "chat.completion.chunk", "choices": [part]}
            if body.get("return_token_ids"):
                part["token_ids"] = [ids[i]]
                if i == 0:
                    chunk["prompt_token_ids"] = list(range(20))
            await response.write(f"data: {json.dumps(chunk)}\n\n".encode())
        end = {**head, "object": "chat.completion.chunk",
               "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}  # fmt: skip
        await response.write(f"data: {json.dumps(end)}\n\ndata: [DONE]\n\n".encode())
        await response.write_eof()
        return response

    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat)
    web.run_app(app, host="127.0.0.1", port=port, print=None, access_log=None)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait_port(port: int, timeout: float, process: subprocess.Popen[bytes] | None = None) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process is not None and process.poll() is not None:
            raise TimeoutError(f"the process for port {port} exited ({process.returncode})")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return
        except OSError:
            time.sleep(0.1)
    raise TimeoutError(f"nothing listens on {port} after {timeout:.0f} s")


def _tenant_gateway() -> tuple[Any, str]:
    """GetTenant from a one-key table (the proxy asks the gateway once, at session creation)."""
    import grpc

    from orchard._proto.orchard.v1 import sandbox_pb2, sandbox_pb2_grpc

    class Tenants(sandbox_pb2_grpc.SandboxServiceServicer):
        def GetTenant(self, request: Any, context: Any) -> Any:
            return sandbox_pb2.TenantView(tenant="bench")

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    sandbox_pb2_grpc.add_SandboxServiceServicer_to_server(Tenants(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    return server, f"127.0.0.1:{port}"


class Path_:
    """One keep-alive connection to one base URL path."""

    def __init__(self, name: str, port: int, prefix: str, key: str = "x") -> None:
        self.name, self.prefix, self.key = name, prefix, key
        self.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        self.latency: list[float] = []
        self.ttft: list[float] = []

    def call(self, stream: bool, record: bool) -> None:
        body = json.dumps({"model": "scripted", "stream": stream, "max_tokens": 64,
                           "messages": [{"role": "user", "content": "fix calc.py"}]})  # fmt: skip
        headers = {"Content-Type": "application/json", "Authorization": f"Bearer {self.key}"}
        started = time.perf_counter()
        self.conn.request("POST", f"{self.prefix}/chat/completions", body, headers)
        response = self.conn.getresponse()
        if not stream:
            data = response.read()
            elapsed = time.perf_counter() - started
            if response.status != 200 or BODY_TEXT not in data.decode():
                raise RuntimeError(f"{self.name}: {response.status} {data[:300]!r}")
            if record:
                self.latency.append(elapsed * 1000)
            return
        first = None
        text = ""
        while True:
            line = response.readline()
            if not line:
                break
            if line.startswith(b"data: {"):
                delta = (json.loads(line[6:])["choices"] or [{}])[0].get("delta", {})
                if delta.get("content") and first is None:
                    first = time.perf_counter() - started
                text += delta.get("content") or ""
            elif line.startswith(b"data: [DONE]"):
                response.read()
                break
        elapsed = time.perf_counter() - started
        if text != BODY_TEXT or first is None:
            raise RuntimeError(f"{self.name}: streamed {text!r}")
        if record:
            self.ttft.append(first * 1000)


def _stats(values: list[float]) -> dict[str, float] | None:
    if not values:
        return None
    q = statistics.quantiles(values, n=100)
    return {
        "p50_ms": round(statistics.median(values), 3),
        "p90_ms": round(q[89], 3),
        "n": len(values),
    }


def _start_litellm(
    binary: str, upstream_port: int, home: Path
) -> tuple[subprocess.Popen[bytes] | None, int, str]:
    port = _free_port()
    config = home / "litellm.yaml"
    config.write_text(
        "model_list:\n  - model_name: scripted\n    litellm_params:\n"
        f"      model: openai/scripted\n      api_base: http://127.0.0.1:{upstream_port}/v1\n"
        "      api_key: dummy\n"
        "litellm_settings:\n  drop_params: true\n  telemetry: false\n"
    )
    # offline: the cost map from the package, no telemetry; a strong master key (LiteLLM
    # refuses to start without one)
    env = {**os.environ, "LITELLM_LOG": "ERROR", "LITELLM_TELEMETRY": "False",
           "LITELLM_LOCAL_MODEL_COST_MAP": "True", "LITELLM_MASTER_KEY": LITELLM_KEY}  # fmt: skip
    log = open(home / "litellm.log", "wb")  # noqa: SIM115 (the process's stderr for its life)
    process = subprocess.Popen([binary, "--config", str(config), "--port", str(port), "--host", "127.0.0.1",
                                "--num_workers", "1"], stdout=log, stderr=subprocess.STDOUT, env=env)  # fmt: skip
    try:
        _wait_port(port, 180, process)
    except TimeoutError as err:
        process.kill()
        return None, 0, f"{err}: {(home / 'litellm.log').read_text()[-500:]}"
    return process, port, ""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--calls", type=int, default=300, help="measured calls per path and mode")
    parser.add_argument("--warmup", type=int, default=30)
    parser.add_argument(
        "--litellm", default=shutil.which("litellm") or "/tmp/proxy-litellm-venv/bin/litellm"
    )
    parser.add_argument("--serve-upstream", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve_upstream:
        serve_upstream(args.serve_upstream)
        return
    children: list[subprocess.Popen[bytes]] = []
    gateway, gateway_address = _tenant_gateway()
    with tempfile.TemporaryDirectory(prefix="bench-modelproxy-") as tmp:
        home = Path(tmp)
        try:
            up_port = _free_port()
            children.append(
                subprocess.Popen([sys.executable, __file__, "--serve-upstream", str(up_port)])
            )
            _wait_port(up_port, 30)
            proxy = subprocess.Popen(
                [sys.executable, "-m", "orchard.modelproxy", "--home", str(home), "--listen", "127.0.0.1:0",
                 "--upstream", f"http://127.0.0.1:{up_port}/v1", "--gateway", gateway_address,
                 "--max-calls-per-session", str(10 * (args.calls + args.warmup) + 10)],
                stdout=subprocess.PIPE, stderr=open(home / "modelproxy.log", "wb"),  # noqa: SIM115
            )  # fmt: skip
            children.append(proxy)
            assert proxy.stdout is not None
            proxy_url = proxy.stdout.readline().decode().strip()
            proxy_port = int(proxy_url.rsplit(":", 1)[1])
            conn = http.client.HTTPConnection("127.0.0.1", proxy_port, timeout=30)
            conn.request("POST", "/v1/sessions", json.dumps({"model_version": "bench"}),
                         {"Authorization": "Bearer k", "Content-Type": "application/json"})  # fmt: skip
            session = json.loads(conn.getresponse().read())
            conn.close()
            litellm_note = ""
            litellm_port = 0
            if Path(args.litellm).exists():
                litellm, litellm_port, litellm_note = _start_litellm(args.litellm, up_port, home)
                if litellm is not None:
                    children.append(litellm)
            else:
                litellm_note = f"litellm not installed ({args.litellm}); see the docstring"
            paths = [Path_("direct", up_port, "/v1"),
                     Path_("orchard_modelproxy", proxy_port, f"/s/{session['credential']}/v1")]  # fmt: skip
            if litellm_port:
                paths.append(Path_("litellm", litellm_port, "/v1", key=LITELLM_KEY))
            for i in range(args.warmup + args.calls):
                for stream in (False, True):
                    for path in paths if i % 2 else reversed(paths):
                        path.call(stream, record=i >= args.warmup)
            load = os.getloadavg()[0]
        finally:
            for child in reversed(children):
                child.terminate()
            for child in children:
                try:
                    child.wait(20)
                except subprocess.TimeoutExpired:
                    child.kill()
            gateway.stop(None)
    by = {p.name: p for p in paths}
    out: dict[str, Any] = {"calls_per_mode": args.calls, "load_average_after": round(load, 2)}
    direct = by["direct"]
    for name, path in by.items():
        out[name] = {"unstreamed": _stats(path.latency), "ttft_streamed": _stats(path.ttft)}
        if name != "direct":
            out[name]["added_p50_ms"] = round(
                statistics.median(path.latency) - statistics.median(direct.latency), 3
            )
            out[name]["added_ttft_p50_ms"] = round(
                statistics.median(path.ttft) - statistics.median(direct.ttft), 3
            )
    if "litellm" not in by:
        out["litellm"] = None
        out["litellm_note"] = litellm_note
    recorded = session["id"]
    out["recorded_session"] = recorded
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    threading.current_thread().name = "bench"
    main()
