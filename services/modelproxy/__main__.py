"""``python -m orchard.modelproxy --home H --listen ADDR --upstream URL [--gateway ADDR]``.

Without an upstream the proxy still serves sessions, and refuses model calls with 503
``UPSTREAM_NOT_CONFIGURED``. Prints ``http://host:port`` once ready and writes ``<home>/run/modelproxy.addr``. The upstream
comes from ``--upstream`` or ``$ORCHARD_MODEL_UPSTREAM`` (an OpenAI-compatible base URL ending
in ``/v1``), its kind from ``--upstream-kind`` or ``$ORCHARD_MODEL_UPSTREAM_KIND``, its key from
``$ORCHARD_MODEL_UPSTREAM_API_KEY``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
from pathlib import Path

from orchard.common.layout import orchard_home
from orchard.common.process import announce_address, start_service

from .service import serve
from .settings import UPSTREAM_KINDS, ModelProxySettings


def parse_args(argv: list[str] | None = None) -> tuple[ModelProxySettings, dict[str, object]]:
    parser = argparse.ArgumentParser(prog="python -m orchard.modelproxy", description=__doc__)
    parser.add_argument("--home", type=Path, default=None, help="node home (default $ORCHARD_HOME)")
    parser.add_argument("--listen", default="127.0.0.1:50090", help="address (port 0: a free one)")
    parser.add_argument(
        "--upstream", default=os.environ.get("ORCHARD_MODEL_UPSTREAM") or "",
        help="the inference server's OpenAI base URL, e.g. http://127.0.0.1:8000/v1",
    )  # fmt: skip
    parser.add_argument(
        "--upstream-kind", choices=UPSTREAM_KINDS,
        default=os.environ.get("ORCHARD_MODEL_UPSTREAM_KIND") or "vllm",
        help="how to ask it for token ids and logprobs (default vllm)",
    )  # fmt: skip
    parser.add_argument(
        "--upstream-extra-body", default="{}",
        help="JSON object merged into every upstream Chat body (another engine's token fields)",
    )  # fmt: skip
    parser.add_argument(
        "--gateway", default=None, help="gateway address (default <home>/run/gateway.addr)"
    )
    parser.add_argument(
        "--gateway-ca", type=Path, default=os.environ.get("ORCHARD_TLS_CA") or None,
        help="CA of a grpcs:// gateway's certificate (default $ORCHARD_TLS_CA)",
    )  # fmt: skip
    parser.add_argument(
        "--public-url", default="",
        help="the proxy's base URL as harnesses reach it (default http://<listen address>)",
    )  # fmt: skip
    parser.add_argument("--max-body-bytes", type=int, default=8 * 1024 * 1024)
    parser.add_argument("--max-calls-per-session", type=int, default=10_000)
    parser.add_argument("--body-timeout-seconds", type=float, default=30.0)
    parser.add_argument("--max-concurrent-calls-per-session", type=int, default=32)
    args = parser.parse_args(argv)
    home = args.home or orchard_home()
    gateway = args.gateway
    if not gateway:
        try:
            gateway = (home / "run" / "gateway.addr").read_text().strip()
        except OSError:
            parser.error("no --gateway and no <home>/run/gateway.addr (is the stack up?)")
    try:
        extra = json.loads(args.upstream_extra_body)
    except ValueError as err:
        parser.error(f"--upstream-extra-body: not JSON: {err}")
    if not isinstance(extra, dict):
        parser.error("--upstream-extra-body: expected a JSON object")
    settings = ModelProxySettings(
        home=home, upstream=args.upstream, gateway=gateway, listen=args.listen,
        upstream_kind=args.upstream_kind,
        upstream_api_key=os.environ.get("ORCHARD_MODEL_UPSTREAM_API_KEY", ""),
        public_url=args.public_url.rstrip("/"), gateway_ca=args.gateway_ca,
        max_body_bytes=args.max_body_bytes, max_calls_per_session=args.max_calls_per_session,
        body_timeout_seconds=args.body_timeout_seconds,
        max_concurrent_calls_per_session=args.max_concurrent_calls_per_session,
    )  # fmt: skip
    return settings, extra


def main(argv: list[str] | None = None) -> None:
    settings, extra = parse_args(argv)
    start_service("modelproxy")
    asyncio.run(serve(settings, on_ready=announce_address, extra_body=extra))


if __name__ == "__main__":
    main()
