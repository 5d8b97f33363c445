"""Traces, metrics and logs of a real stack: one trace across the service processes."""

from __future__ import annotations

import json
import secrets
import time
import urllib.error
import urllib.request

import pytest

from .conftest import GatewayStack
from .test_rest import curl

pytestmark = pytest.mark.runc


def spans_of(gw: GatewayStack, trace_id: str) -> list[dict[str, object]]:
    path = gw.home / "traces.jsonl"
    deadline = time.monotonic() + 10
    while True:
        spans = [
            json.loads(line)
            for line in path.read_text().splitlines()
            if line.strip() and json.loads(line)["trace_id"] == trace_id
        ]
        services = {s["service"] for s in spans}
        if {"orchard-gateway", "orchard-scheduler", "orchard-executor"} <= services:
            return spans
        if time.monotonic() > deadline:
            return spans
        time.sleep(0.2)


def scrape(gw: GatewayStack, service: str) -> str:
    token = (gw.home / "secrets" / "metrics-token").read_text().strip()
    request = urllib.request.Request(
        f"http://{gw.metrics_address(service)}/metrics",
        headers={"Authorization": f"Bearer {token}"},
    )
    with urllib.request.urlopen(request, timeout=10) as r:
        return str(r.read().decode())


@pytest.mark.parametrize("service", ["gateway", "scheduler", "executor"])
@pytest.mark.parametrize("authorization", [None, "Bearer wrong-token-0123456789", "Basic eA=="])
def test_metrics_refuse_a_scraper_without_the_token(
    gw: GatewayStack, service: str, authorization: str | None
) -> None:
    """Tenants' names, sandbox counts and call rates are not for any local process."""
    headers = {} if authorization is None else {"Authorization": authorization}
    request = urllib.request.Request(
        f"http://{gw.metrics_address(service)}/metrics", headers=headers
    )
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(request, timeout=10)
    assert refused.value.code == 401
    assert refused.value.headers["WWW-Authenticate"] == "Bearer"
    body = refused.value.read().decode()
    assert "secrets/metrics-token" in body and "orchard_" not in body, body
    token_file = gw.home / "secrets" / "metrics-token"
    assert token_file.stat().st_mode & 0o777 == 0o600


def test_one_trace_spans_gateway_scheduler_backend_and_executor(gw: GatewayStack) -> None:
    key = gw.new_tenant("traced")
    trace_id = secrets.token_hex(16)
    traceparent = f"traceparent: 00-{trace_id}-{secrets.token_hex(8)}-01"
    request_id = "req-" + secrets.token_hex(6)
    status, _, text = curl(
        gw, "/v1/SandboxService/CreateSandbox", {}, key, traceparent, f"x-request-id: {request_id}"
    )
    assert status == 200, text
    sid = json.loads(text)["id"]
    status, _, text = curl(
        gw, "/v1/ExecutorService/Run", {"start": {"sandbox_id": sid, "argv": ["true"]}}, key,
        traceparent,
    )  # fmt: skip
    assert status == 200, text
    curl(gw, "/v1/SandboxService/DeleteSandbox", {"id": sid}, key)

    spans = spans_of(gw, trace_id)
    by_name = {(s["service"], s["name"]) for s in spans}
    assert ("orchard-gateway", "orchard.v1.SandboxService/CreateSandbox") in by_name, by_name
    assert ("orchard-scheduler", "orchard.v1.SandboxService/CreateSandbox") in by_name, by_name
    assert ("orchard-scheduler", "backend.create") in by_name, by_name
    assert ("orchard-executor", "orchard.v1.ExecutorService/Run") in by_name, by_name
    # Parent links: the scheduler's create is a child of the gateway's; backend.create of the scheduler's.
    ids = {s["span_id"]: s for s in spans}
    backend = next(s for s in spans if s["name"] == "backend.create")
    parent = ids[str(backend["parent_id"])]
    assert (parent["service"], parent["name"]) == (
        "orchard-scheduler",
        "orchard.v1.SandboxService/CreateSandbox",
    )
    grandparent = ids[str(parent["parent_id"])]
    assert grandparent["service"] == "orchard-gateway"
    assert all(s["trace_id"] == trace_id for s in spans)

    # The request id followed the call into the scheduler's log, with tenant and sandbox.
    lines = [
        json.loads(line)
        for line in (gw.home / "logs" / "scheduler.log").read_text().splitlines()
        if line.startswith("{")
    ]
    ready = [e for e in lines if e.get("event") == "sandbox ready" and e.get("sandbox_id") == sid]
    assert ready and ready[0]["request_id"] == request_id and ready[0]["tenant"] == "traced"
    assert ready[0]["trace_id"] == trace_id and ready[0]["service"] == "scheduler"


def test_metrics_are_served_by_every_service(gw: GatewayStack) -> None:
    key = gw.new_tenant("metered", max_sandboxes=1)
    _, _, text = curl(gw, "/v1/SandboxService/CreateSandbox", {}, key)
    sid = json.loads(text)["id"]
    try:
        assert curl(gw, "/v1/SandboxService/CreateSandbox", {}, key)[0] == 429
        curl(gw, "/v1/ExecutorService/Run", {"start": {"sandbox_id": sid, "argv": ["true"]}}, key)
        scheduler = scrape(gw, "scheduler")
        assert 'orchard_sandboxes{state="ready",tenant="metered"} 1.0' in scheduler
        assert (
            'orchard_quota_rejections_total{quota="max_sandboxes",service="scheduler",tenant="metered"} 1.0'
            in scheduler
        )
        assert 'orchard_phase_seconds_count{phase="create"}' in scheduler
        gateway = scrape(gw, "gateway")
        for phase in ("queue", "ready"):
            assert f'orchard_phase_seconds_count{{phase="{phase}"}}' in gateway
        assert (
            'orchard_rpc_requests_total{code="OK",method="CreateSandbox",service="gateway"}'
            in gateway
        )
        executor = scrape(gw, "executor")
        for phase in ("exec", "first_exec"):
            assert f'orchard_phase_seconds_count{{phase="{phase}"}}' in executor
    finally:
        curl(gw, "/v1/SandboxService/DeleteSandbox", {"id": sid}, key)
