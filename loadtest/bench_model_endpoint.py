"""Model endpoint benchmark: what a Chat call costs through a sandbox's endpoint vs from the host.

Starts a real ``orchard up --model-upstream`` (the recording model proxy in front of
``bench_modelproxy``'s scripted aiohttp upstream in its own process, vLLM-shaped answers at
once; ``orchard.testing.scripted_model``'s stdlib server writes head and body apart and pays
a 40 ms delayed-ACK stall per call, which would hide the figure) in a temporary home, makes one
session and one sandbox with policy ``none`` and ``model_endpoint=True``, then runs the
same client script (``http.client``, unstreamed Chat calls) two ways, in alternating rounds
so both see the same noise:

- ``direct``: on the host, to the proxy's own address (``run/modelproxy.addr``);
- ``endpoint``: inside the sandbox, to ``$ORCHARD_MODEL_BASE`` (127.0.0.1:7711 in the
  sandbox's namespace, relayed by the scheduler to the same proxy).

Each way twice: one kept-alive connection for every call (``keepalive``: what a harness's
HTTP client does), and a new connection per call (``new_connection``: the relay's accept,
the connect to the proxy and the teardown on every call). Prints one JSON object:
per way and mode p50/p90/p99 in ms and the p50 the endpoint adds.

    flock /tmp/orchard-heavy.lock .venv/bin/python loadtest/bench_model_endpoint.py [--calls 200] [--rounds 5]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from loadtest.bench_modelproxy import _free_port, _wait_port
from loadtest.peer_swerex import percentiles
from orchard import Orchard
from tests.stack import running_stack

# argv: base URL (no /s/...), credential, calls, "keepalive" | "new_connection".
# Prints the per-call latencies in ms, one JSON list.
CLIENT = """
import http.client, json, sys, time, urllib.parse
base, credential, calls, mode = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
url = urllib.parse.urlsplit(base)
path = "/s/" + credential + "/v1/chat/completions"
body = json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}]}).encode()
headers = {"Content-Type": "application/json"}
conn = None
out = []
for i in range(calls + 5):
    if conn is None or mode == "new_connection":
        if conn is not None:
            conn.close()
        started = time.perf_counter()
        conn = http.client.HTTPConnection(url.hostname, url.port, timeout=30)
    else:
        started = time.perf_counter()
    conn.request("POST", path, body=body + b" " * (i % 2), headers=headers)
    answer = conn.getresponse()
    answer.read()
    assert answer.status == 200, answer.status
    if i >= 5:  # warm-up calls are not counted
        out.append((time.perf_counter() - started) * 1000)
print(json.dumps(out))
"""


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--calls", type=int, default=200, help="calls per way, mode and round")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    modes = ("keepalive", "new_connection")
    samples: dict[str, dict[str, list[float]]] = {
        way: {mode: [] for mode in modes} for way in ("direct", "endpoint")
    }
    up_port = _free_port()
    script = Path(__file__).resolve().parent / "bench_modelproxy.py"
    upstream_process = subprocess.Popen(
        [sys.executable, str(script), "--serve-upstream", str(up_port)]
    )
    _wait_port(up_port, 30, upstream_process)
    upstream = f"http://127.0.0.1:{up_port}/v1"
    with (
        tempfile.TemporaryDirectory(prefix="orch-endpointbench-") as home,
        running_stack(Path(home), up_args=["--model-upstream", upstream]) as stack,
    ):
        key = (stack.home / "dev-api-key").read_text().strip()
        proxy = (stack.home / "run" / "modelproxy.addr").read_text().strip()
        request = urllib.request.Request(
            f"{proxy}/v1/sessions", data=b"{}", headers={"Authorization": f"Bearer {key}"}
        )
        with urllib.request.urlopen(request, timeout=30) as answer:
            credential = json.load(answer)["credential"]
        client = Orchard(stack.endpoint, key)
        with client.sandboxes.create(network="none", model_endpoint=True, ttl=900) as sb:
            base = sb.info().model_endpoint
            for _ in range(args.rounds):
                for mode in modes:
                    run = [str(args.calls), mode]
                    host = subprocess.run(
                        [sys.executable, "-c", CLIENT, proxy, credential, *run],
                        capture_output=True, text=True, check=True, timeout=600,
                    )  # fmt: skip
                    samples["direct"][mode] += json.loads(host.stdout)
                    inside = sb.exec(["python3", "-c", CLIENT, base, credential, *run], timeout=600)
                    assert inside.exit_code == 0, inside.stderr_text
                    samples["endpoint"][mode] += json.loads(inside.stdout_text)
    upstream_process.terminate()
    upstream_process.wait(10)
    out: dict[str, object] = {"calls": args.calls, "rounds": args.rounds,
                              "load_average": Path("/proc/loadavg").read_text().split()[:3]}  # fmt: skip
    for mode in modes:
        direct = percentiles(samples["direct"][mode])
        endpoint = percentiles(samples["endpoint"][mode])
        out[mode] = {
            "direct": direct,
            "endpoint": endpoint,
            "added_p50_ms": round(endpoint["p50_ms"] - direct["p50_ms"], 3),
        }
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
