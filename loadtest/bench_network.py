"""Network policy benchmark: what a policy costs at create and at change, through the SDK.

Starts a real ``orchard up`` in a temporary home and measures, one call at a
time, ``client.sandboxes.create`` with policy ``none`` (the fast path: no veth, no
rules) against ``internet`` and ``allowlist`` (veth, nft transaction, proxy
entry), then ``set_network`` on a running sandbox (none -> internet -> none).
No packet leaves the machine: nothing is connected to.

Prints one JSON object (latencies in ms, p50/p90/p99 and the ratio of each
policy's create p50 to ``none``'s from the same run).

    .venv/bin/python loadtest/bench_network.py [--creates 20] [--changes 20]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from loadtest.peer_swerex import percentiles
from orchard import NetworkPolicy, Orchard
from tests.stack import running_stack


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--creates", type=int, default=20)
    parser.add_argument("--changes", type=int, default=20)
    args = parser.parse_args()
    policies: dict[str, str | NetworkPolicy] = {
        "none": "none",
        "internet": "internet",
        "allowlist": NetworkPolicy.allowlist(cidrs=["203.0.113.0/24"], domains=["example.test"]),
    }
    out: dict[str, object] = {"creates": args.creates, "changes": args.changes}
    with (
        tempfile.TemporaryDirectory(prefix="orch-netbench-") as home,
        running_stack(Path(home)) as stack,
    ):
        key = (stack.home / "dev-api-key").read_text().strip()
        client = Orchard(stack.endpoint, key)
        client.sandboxes.create().delete()  # warm up
        create_ms: dict[str, list[float]] = {name: [] for name in policies}
        for _ in range(args.creates):
            for name, policy in policies.items():  # interleaved: same noise for each
                started = time.perf_counter()
                sb = client.sandboxes.create(network=policy, ttl=300)
                create_ms[name].append((time.perf_counter() - started) * 1000)
                sb.delete()
        change_ms: list[float] = []
        with client.sandboxes.create(ttl=300) as sb:
            for _ in range(args.changes):
                for target in ("internet", "none"):
                    started = time.perf_counter()
                    sb.set_network(target)
                    change_ms.append((time.perf_counter() - started) * 1000)
        out["create_ms"] = {name: percentiles(v) for name, v in create_ms.items()}
        base = out["create_ms"]["none"]["p50_ms"]  # type: ignore[index]
        out["create_p50_ratio_to_none"] = {
            name: round(percentiles(v)["p50_ms"] / base, 2) for name, v in create_ms.items()
        }
        out["set_network_ms"] = percentiles(change_ms)
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
