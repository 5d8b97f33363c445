"""TLS on the node executor's data plane, against the real executor process and a real
orchard-init (a host sandbox: no container is needed to test the transport).

Each refusal is checked against the same server a correct client then reaches: a
plaintext client, a client trusting another CA, a server whose certificate expired,
and (mTLS) a client without a certificate or with one from another CA.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from orchard.executor.initbin import ensure_init_binary

from orchard._proto.orchard.v1 import executor_pb2 as pb
from orchard._proto.orchard.v1 import executor_pb2_grpc as pb_grpc
from orchard.client._tls import TLS, parse_endpoint
from orchard.common.layout import NodeLayout
from orchard.common.tokens import TokenSigner
from tests.executor.harness import ExecutorProcess, HostSandbox

from .certs import Certs, make_certs

SANDBOX = "sb-tls-test"


@pytest.fixture(scope="module")
def home() -> Iterator[Path]:
    folder = Path(tempfile.mkdtemp(prefix="oe-tls-", dir="/tmp"))
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture(scope="module")
def certs(home: Path) -> Certs:
    return make_certs(home / "certs")


@pytest.fixture(scope="module")
def sandbox(home: Path) -> Iterator[HostSandbox]:
    box = HostSandbox(SANDBOX, home, ensure_init_binary(home)).create()
    try:
        yield box
    finally:
        box.stop()


def _executor(home: Path, *args: str) -> Iterator[ExecutorProcess]:
    process = ExecutorProcess.start(home, *args)
    try:
        yield process
    finally:
        process.stop()


@pytest.fixture(scope="module")
def tls_executor(home: Path, certs: Certs, sandbox: HostSandbox) -> Iterator[ExecutorProcess]:
    yield from _executor(
        home, "--tls-cert", str(certs.server.cert), "--tls-key", str(certs.server.key)
    )


@pytest.fixture(scope="module")
def mtls_executor(home: Path, certs: Certs, sandbox: HostSandbox) -> Iterator[ExecutorProcess]:
    yield from _executor(
        home,
        "--tls-cert",
        str(certs.server.cert),
        "--tls-key",
        str(certs.server.key),
        "--tls-client-ca",
        str(certs.ca),
    )


def _run(channel: grpc.Channel, home: Path) -> pb.RunResponse:
    token, _ = TokenSigner(NodeLayout(home).keyring_file()).issue(SANDBOX, 600)
    stub = pb_grpc.ExecutorServiceStub(channel)  # type: ignore[no-untyped-call]
    request = pb.RunRequest(start=pb.ExecStart(sandbox_id=SANDBOX, argv=["echo", "over tls"]))
    response: pb.RunResponse = stub.Run(
        request, metadata=(("authorization", f"Bearer {token}"),), timeout=10
    )
    return response


def _secure(address: str, tls: TLS) -> grpc.Channel:
    endpoint = parse_endpoint(f"grpcs://{address}")
    return grpc.secure_channel(endpoint.target, tls.channel_credentials(), tls.channel_options())


def _refused(channel: grpc.Channel, home: Path) -> grpc.RpcError:
    with channel, pytest.raises(grpc.RpcError) as caught:
        _run(channel, home)
    assert caught.value.code() == grpc.StatusCode.UNAVAILABLE, caught.value  # type: ignore[attr-defined]
    return caught.value


def test_a_client_trusting_the_ca_execs(
    tls_executor: ExecutorProcess, certs: Certs, home: Path
) -> None:
    with _secure(tls_executor.address, TLS(ca=certs.ca)) as channel:
        response = _run(channel, home)
    assert response.status.exit_code == 0
    assert response.stdout == b"over tls\n"


def test_the_ca_may_be_given_as_pem_bytes(
    tls_executor: ExecutorProcess, certs: Certs, home: Path
) -> None:
    with _secure(tls_executor.address, TLS(ca=certs.ca.read_bytes())) as channel:
        assert _run(channel, home).stdout == b"over tls\n"


def test_a_plaintext_client_is_refused(tls_executor: ExecutorProcess, home: Path) -> None:
    _refused(grpc.insecure_channel(tls_executor.address), home)


def test_a_client_trusting_another_ca_is_refused(
    tls_executor: ExecutorProcess, certs: Certs, home: Path
) -> None:
    _refused(_secure(tls_executor.address, TLS(ca=certs.other_ca)), home)


def test_a_client_with_the_system_roots_only_is_refused(
    tls_executor: ExecutorProcess, home: Path
) -> None:
    _refused(_secure(tls_executor.address, TLS()), home)


def test_a_certificate_for_another_name_is_refused(
    tls_executor: ExecutorProcess, certs: Certs, home: Path
) -> None:
    """The right CA, but the certificate does not name what the client checks."""
    _refused(_secure(tls_executor.address, TLS(ca=certs.ca, server_name="sandboxes.example")), home)


def test_an_expired_server_certificate_is_refused(
    home: Path, certs: Certs, sandbox: HostSandbox
) -> None:
    for process in _executor(
        home,
        "--tls-cert",
        str(certs.expired_server.cert),
        "--tls-key",
        str(certs.expired_server.key),
    ):
        _refused(_secure(process.address, TLS(ca=certs.ca)), home)


def test_mtls_refuses_a_client_without_a_certificate(
    mtls_executor: ExecutorProcess, certs: Certs, home: Path
) -> None:
    _refused(_secure(mtls_executor.address, TLS(ca=certs.ca)), home)


def test_mtls_refuses_a_certificate_from_another_ca(
    mtls_executor: ExecutorProcess, certs: Certs, home: Path
) -> None:
    stranger = TLS(ca=certs.ca, cert=certs.other_client.cert, key=certs.other_client.key)
    _refused(_secure(mtls_executor.address, stranger), home)


def test_mtls_accepts_the_ca_s_client_certificate(
    mtls_executor: ExecutorProcess, certs: Certs, home: Path
) -> None:
    client = TLS(ca=certs.ca, cert=certs.client.cert, key=certs.client.key)
    with _secure(mtls_executor.address, client) as channel:
        assert _run(channel, home).status.exit_code == 0


def test_a_key_that_does_not_match_is_a_usage_error(home: Path, certs: Certs) -> None:
    """Refused at start with the files named, before anything listens."""
    result = subprocess.run(
        [sys.executable, "-m", "orchard.executor", "--home", str(home), "--listen", "127.0.0.1:0",
         "--tls-cert", str(certs.server.cert), "--tls-key", str(certs.client.key)],
        capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert result.returncode == 2, result
    assert "do not load together" in result.stderr
    assert str(certs.client.key) in result.stderr
    assert result.stdout == ""  # never announced an address


def test_half_a_pair_is_a_usage_error(home: Path, certs: Certs) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "orchard.executor", "--home", str(home), "--listen", "127.0.0.1:0",
         "--tls-cert", str(certs.server.cert)],
        capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL,
        env={k: v for k, v in os.environ.items() if not k.startswith("ORCHARD_TLS_")},
    )  # fmt: skip
    assert result.returncode == 2, result
    assert "both a certificate and a key" in result.stderr
