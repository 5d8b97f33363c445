"""A real ``orchard up --tls --data-plane-proxy nginx`` stack (real processes, runc, nginx),
reached only over TLS with the CA it wrote to ``run/ca.pem``.

Raw gRPC channels built from the SDK's own :class:`orchard.client._tls.TLS` drive the
control plane (the gateway), the direct data plane (the node executor, as
``ExecutorAccess.tls`` says), the gateway's Python data-plane proxy (which must itself
dial the TLS executor) and the nginx proxy (TLS on both of its sides); curl drives the
REST front over https. A plaintext client and a client that trusts another CA are
refused by the same stack.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from orchard import (
    TLS,
    AsyncOrchard,
    InvalidRequestError,
    Orchard,
    ServiceUnavailableError,
)
from orchard._proto.orchard.v1 import executor_pb2 as epb
from orchard._proto.orchard.v1 import executor_pb2_grpc as epb_grpc
from orchard._proto.orchard.v1 import sandbox_pb2 as spb
from orchard._proto.orchard.v1 import sandbox_pb2_grpc as spb_grpc
from orchard.client._tls import parse_endpoint
from orchard.common.local_ca import cert_pem, make_ca
from tests.stack import REQUIRES_STACK, Stack, running_stack

pytestmark = [
    *REQUIRES_STACK,
    pytest.mark.skipif(shutil.which("nginx") is None, reason="needs nginx (make system-deps)"),
    pytest.mark.skipif(shutil.which("curl") is None, reason="needs curl"),
]


@pytest.fixture(scope="module")
def stack() -> Iterator[Stack]:
    with tempfile.TemporaryDirectory(prefix="orchard-tls-") as tmp:
        home = Path(tmp) / "home"
        home.mkdir()
        with running_stack(home, up_args=("--tls", "--data-plane-proxy", "nginx")) as up:
            yield up


def _read(stack: Stack, name: str) -> str:
    return (stack.home / "run" / name).read_text().strip()


def _channel(endpoint: str, tls: TLS | None) -> grpc.Channel:
    parsed = parse_endpoint(endpoint)
    assert parsed.tls, f"{endpoint} should be a grpcs:// endpoint"
    if tls is None:
        return grpc.insecure_channel(parsed.target)
    return grpc.secure_channel(parsed.target, tls.channel_credentials(), tls.channel_options())


def _key(stack: Stack) -> tuple[tuple[str, str], ...]:
    return (("authorization", f"Bearer {(stack.home / 'dev-api-key').read_text().strip()}"),)


def _trusted(stack: Stack) -> TLS:
    return TLS(ca=stack.home / "run" / "ca.pem")


@pytest.fixture(scope="module")
def sandbox(stack: Stack) -> Iterator[spb.Sandbox]:
    with _channel(stack.endpoint, _trusted(stack)) as channel:
        control = spb_grpc.SandboxServiceStub(channel)
        created: spb.Sandbox = control.CreateSandbox(
            spb.CreateSandboxRequest(), metadata=_key(stack), timeout=60
        )
        try:
            yield created
        finally:
            control.DeleteSandbox(
                spb.DeleteSandboxRequest(id=created.id), metadata=_key(stack), timeout=60
            )


def _run(channel: grpc.Channel, sandbox: spb.Sandbox, text: str) -> epb.RunResponse:
    stub = epb_grpc.ExecutorServiceStub(channel)  # type: ignore[no-untyped-call]
    request = epb.RunRequest(start=epb.ExecStart(sandbox_id=sandbox.id, shell=f"echo {text}"))
    response: epb.RunResponse = stub.Run(
        request,
        metadata=(("authorization", f"Bearer {sandbox.executor.token}"),),
        timeout=30,
    )
    return response


def test_every_address_file_says_grpcs_or_https(stack: Stack) -> None:
    assert stack.endpoint.startswith("grpcs://127.0.0.1:")
    assert _read(stack, "gateway.addr") == stack.endpoint
    assert _read(stack, "gateway-http.addr").startswith("https://127.0.0.1:")
    assert _read(stack, "data-plane.addr").startswith("grpcs://127.0.0.1:")
    assert _read(stack, "rewards.addr").startswith("grpcs://127.0.0.1:")
    assert _read(stack, "ca.pem").startswith("-----BEGIN CERTIFICATE-----")


def test_the_control_plane_answers_over_tls_and_says_the_executor_is_tls(
    sandbox: spb.Sandbox,
) -> None:
    assert sandbox.state == spb.READY
    assert sandbox.executor.tls is True
    assert sandbox.executor.address.startswith("127.0.0.1:")


def test_direct_data_plane_over_tls(stack: Stack, sandbox: spb.Sandbox) -> None:
    with _channel(f"grpcs://{sandbox.executor.address}", _trusted(stack)) as channel:
        response = _run(channel, sandbox, "direct")
    assert (response.status.exit_code, response.stdout) == (0, b"direct\n")


def test_the_gateways_python_proxy_dials_the_tls_executor(
    stack: Stack, sandbox: spb.Sandbox
) -> None:
    with _channel(stack.endpoint, _trusted(stack)) as channel:
        response = _run(channel, sandbox, "via-gateway")
    assert (response.status.exit_code, response.stdout) == (0, b"via-gateway\n")


def test_the_nginx_proxy_over_tls_both_ways(stack: Stack, sandbox: spb.Sandbox) -> None:
    with _channel(_read(stack, "data-plane.addr"), _trusted(stack)) as channel:
        response = _run(channel, sandbox, "via-nginx")
    assert (response.status.exit_code, response.stdout) == (0, b"via-nginx\n")


def test_the_rest_front_over_https(stack: Stack, sandbox: spb.Sandbox) -> None:
    key = (stack.home / "dev-api-key").read_text().strip()
    base = _read(stack, "gateway-http.addr")
    body = json.dumps({"start": {"sandbox_id": sandbox.id, "shell": "echo rest"}})
    out = subprocess.run(
        ["curl", "-sS", "--fail-with-body", "--cacert", str(stack.home / "run" / "ca.pem"),
         "-H", f"Authorization: Bearer {key}", "-H", "Content-Type: application/json",
         "-d", body, f"{base}/v1/ExecutorService/Run"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr + out.stdout
    answer = json.loads(out.stdout)
    assert answer["status"].get("exit_code", 0) == 0
    assert answer["stdout"] == "cmVzdAo="  # base64 of "rest\n"
    refused = subprocess.run(
        ["curl", "-sS", "-o", "/dev/null", "-w", "%{http_code}", "-X", "POST",
         f"http://{base.removeprefix('https://')}/v1/SandboxService/ListSandboxes"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert refused.stdout != "200", "plain HTTP must not be answered on the TLS port"


@pytest.mark.parametrize("where", ["gateway", "executor", "nginx"])
def test_plaintext_and_a_foreign_ca_are_refused(
    stack: Stack, sandbox: spb.Sandbox, where: str, tmp_path: Path
) -> None:
    endpoint = {
        "gateway": stack.endpoint,
        "executor": f"grpcs://{sandbox.executor.address}",
        "nginx": _read(stack, "data-plane.addr"),
    }[where]
    other, _ = make_ca("not the stack's CA")
    for tls in (None, TLS(ca=cert_pem(other))):
        with _channel(endpoint, tls) as channel, pytest.raises(grpc.RpcError) as caught:
            _run(channel, sandbox, "never")
        assert caught.value.code() == grpc.StatusCode.UNAVAILABLE, (where, tls, caught.value)  # type: ignore[attr-defined]


# ---- the SDK's client object over the same stack -------------------------------------


@pytest.fixture
def home_env(stack: Stack, monkeypatch: pytest.MonkeyPatch) -> Stack:
    """The environment a user of this stack has: only ORCHARD_HOME (no endpoint, no CA)."""
    for name in list(os.environ):
        if name.startswith(("ORCHARD_ENDPOINT", "ORCHARD_API_KEY", "ORCHARD_TLS_", "ORCHARD_DATA")):
            monkeypatch.delenv(name)
        if name == "ORCHARD_REWARDS_ENDPOINT":
            monkeypatch.delenv(name)
    monkeypatch.setenv("ORCHARD_HOME", str(stack.home))
    return stack


@pytest.mark.parametrize("data_plane", ["direct", "proxy"])
def test_the_client_finds_the_endpoint_and_ca_in_the_home(home_env: Stack, data_plane: str) -> None:
    """Direct: the executor over TLS (ExecutorAccess.tls); proxy: nginx over TLS
    (run/data-plane.addr says grpcs://)."""
    with Orchard(data_plane=data_plane) as client:
        assert client.config.endpoint == home_env.endpoint and client.config.tls is not None
        with client.sandboxes.create() as sb:
            sb.write_file("/tmp/t.txt", b"secret")
            result = sb.exec("cat /tmp/t.txt")
            assert (result.exit_code, result.stdout) == (0, b"secret")


def test_explicit_tls_turns_a_bare_endpoint_secure(home_env: Stack, sandbox: spb.Sandbox) -> None:
    bare = home_env.endpoint.removeprefix("grpcs://")
    key = (home_env.home / "dev-api-key").read_text().strip()
    tls = TLS(ca=(home_env.home / "run" / "ca.pem").read_bytes())
    with Orchard(bare, key, tls=tls) as client:
        assert client.config.endpoint == home_env.endpoint
        assert sandbox.id in {s.id for s in client.sandboxes.list()}


def test_an_explicit_endpoint_does_not_trust_the_home_ca(home_env: Stack) -> None:
    """Given an endpoint of its own, the client trusts the system's roots, which do not
    know the stack's local CA: refused, as infrastructure."""
    key = (home_env.home / "dev-api-key").read_text().strip()
    with Orchard(home_env.endpoint, key) as client, pytest.raises(ServiceUnavailableError):
        client.sandboxes.list()


def test_the_async_client_over_tls(home_env: Stack) -> None:
    async def main() -> tuple[int, bytes]:
        async with AsyncOrchard() as client:
            sb = await client.sandboxes.create()
            try:
                result = await sb.exec("echo async")
                return result.exit_code, result.stdout
            finally:
                await sb.delete()

    assert asyncio.run(main()) == (0, b"async\n")


def test_rewards_over_tls_both_ways(home_env: Stack) -> None:
    """Client -> rewards (grpcs:// in run/rewards.addr) and rewards -> gateway (the key
    check) are both TLS; an unknown template is the service's own answer."""
    with Orchard() as client, pytest.raises(InvalidRequestError, match="template"):
        client.rewards.judge("no-such-template", {"x": "y"})


def test_a_grade_runs_its_sandbox_through_the_tls_gateway(home_env: Stack) -> None:
    """The rewards service's own SDK client creates the grading sandbox over grpcs://
    (trusting ORCHARD_TLS_CA, which orchard up --tls sets for it) and execs over TLS."""
    samples = Path(__file__).parents[2] / "recipes" / "swe" / "samples"
    row = json.loads((samples / "instances.jsonl").read_text().splitlines()[0])
    gold = (samples / "calc_divide" / "gold.patch").read_text()
    with Orchard() as client:
        report = client.rewards.grade(row, gold)
    assert (report.kind, report.resolved) == ("graded", True), report.reason


def test_the_cli_over_tls(home_env: Stack) -> None:
    created = home_env.cli("create", check=True)
    sid = created.stdout.strip()
    try:
        out = home_env.cli("exec", sid, "--", "echo", "cli", check=True)
        assert out.stdout == "cli\n"
    finally:
        home_env.cli("rm", sid)
