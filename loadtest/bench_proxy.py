"""Gateway data-plane proxy overhead: exec ``true`` direct vs through the gateway, A/B.

One sandbox, two SDK handles on it: one sends data-plane calls straight to the
node executor (``direct``), the other through the gateway's proxy (``proxy``).
Rounds of ``per_round`` sequential ``exec(["true"])`` alternate between the
two (the order flips every round), so machine noise hits both alike; the
overhead is the median of the per-round differences of the round medians,
beside the pooled p50s. With a data-plane endpoint (``orchard up
--data-plane-proxy nginx``'s ``run/data-plane.addr``) a third handle goes
through nginx in the same rotation (``nginx``, ``nginx_overhead_p50_ms``).

    .venv/bin/python loadtest/bench_proxy.py [--rounds 10] [--per-round 200] [--no-nginx]

(starts its own ``orchard up`` in a temporary home, with the nginx proxy unless
``--no-nginx``; prints JSON).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from loadtest.peer_swerex import percentiles
from orchard import Orchard, Sandbox


def _round(sb: Sandbox, n: int) -> list[float]:
    samples = []
    for _ in range(n):
        t0 = time.perf_counter()
        sb.exec(["true"])
        samples.append((time.perf_counter() - t0) * 1000)
    return samples


def proxy_overhead(
    endpoint: str,
    key: str,
    sandbox_id: str,
    rounds: int = 10,
    per_round: int = 200,
    data_plane_endpoint: str | None = None,
) -> dict[str, Any]:
    """Direct vs proxied (gateway, and nginx when given) exec p50 in rotating rounds,
    and the paired overheads."""
    direct = Orchard(endpoint, key, data_plane="direct").sandboxes.connect(sandbox_id)
    proxied = Orchard(endpoint, key, data_plane="proxy").sandboxes.connect(sandbox_id)
    handles = [("direct", direct), ("proxy", proxied)]
    if data_plane_endpoint:
        nginx_config = replace(
            proxied.config, data_plane="proxy", data_plane_endpoint=data_plane_endpoint
        )
        via_nginx = Orchard.from_config(nginx_config).sandboxes.connect(sandbox_id)
        handles.append(("nginx", via_nginx))
    for _, sb in handles:
        _round(sb, 50)  # warm channels, routes, caches
    pooled: dict[str, list[float]] = {name: [] for name, _ in handles}
    diffs: dict[str, list[float]] = {name: [] for name, _ in handles[1:]}
    for i in range(rounds):
        order = handles[i % len(handles) :] + handles[: i % len(handles)]
        if i % 2:
            order.reverse()
        medians = {}
        for name, sb in order:
            samples = _round(sb, per_round)
            pooled[name] += samples
            medians[name] = statistics.median(samples)
        for name in diffs:
            diffs[name].append(medians[name] - medians["direct"])
    out: dict[str, Any] = {name: percentiles(samples) for name, samples in pooled.items()}
    out["overhead_p50_ms"] = round(statistics.median(diffs["proxy"]), 3)
    out["overhead_round_diffs_ms"] = [round(d, 3) for d in diffs["proxy"]]
    if "nginx" in diffs:
        out["nginx_overhead_p50_ms"] = round(statistics.median(diffs["nginx"]), 3)
        out["nginx_overhead_round_diffs_ms"] = [round(d, 3) for d in diffs["nginx"]]
    return {**out, "rounds": rounds, "per_round": per_round}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--per-round", type=int, default=200)
    parser.add_argument("--no-nginx", action="store_true", help="gateway proxy only")
    args = parser.parse_args()
    from tests.stack import running_stack

    os.environ["ORCHARD_DATA_PLANE_PROXY"] = "python" if args.no_nginx else "nginx"

    with (
        tempfile.TemporaryDirectory(prefix="orchard-bench-proxy-") as tmp,
        running_stack(Path(tmp) / "home") as stack,
    ):
        key = (stack.home / "dev-api-key").read_text().strip()
        nginx = None if args.no_nginx else (stack.home / "run" / "data-plane.addr").read_text()
        with Orchard(stack.endpoint, key).sandboxes.create() as sb:
            result = proxy_overhead(
                stack.endpoint, key, sb.id, args.rounds, args.per_round, nginx and nginx.strip()
            )
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
