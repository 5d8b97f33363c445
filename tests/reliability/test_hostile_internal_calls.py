"""Local processes calling the internal services of a real ``orchard up`` with forged tenants.

The scheduler believes the ``orchard-tenant`` / ``orchard-quota`` metadata of its caller,
so before internal mutual TLS any local process could list any tenant's sandboxes, get
their data-plane tokens and run commands in them, without quotas. The attacker
(``internal_attacker.py``, a real subprocess) calls the scheduler's SandboxService and
PoolService, the node executor, the rewards service and the gateway directly, with forged
metadata and no credential, as ``nobody`` and as root without the certificate.

What holds now: the scheduler speaks only TLS, and every call must carry a credential
signed with a certificate of the internal CA (``internal_credential``), whose keys are
root's (0600 in a 0700 folder). A TLS caller without one gets UNAUTHENTICATED naming the
missing credential (before: a refused handshake, which the client saw as UNAVAILABLE); one
signed by another CA's certificate, UNAUTHENTICATED naming that; a caller with a
certificate of the internal CA that is not the gateway's, PERMISSION_DENIED naming who may
call. Plaintext to the TLS port cannot be answered a status (UNAVAILABLE) and gets
nothing. The other listeners answer UNAUTHENTICATED: the executor wants a sandbox token,
the rewards service and the gateway an API key.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from orchard import Orchard, Sandbox
from orchard._proto.orchard.v1 import sandbox_pb2, sandbox_pb2_grpc
from orchard.common.internal_pki import InternalPKI
from tests.stack import REQUIRES_STACK, Stack, running_stack

pytestmark = [*REQUIRES_STACK, pytest.mark.reliability]

REPO = Path(__file__).resolve().parents[2]
NOBODY = 65534
FORGED = (("orchard-tenant", "dev"), ("orchard-quota", "max_sandboxes=100000"))


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    with running_stack(tmp_path_factory.mktemp("internal-home")) as s:
        yield s


@pytest.fixture(scope="module")
def victim(stack: Stack) -> Iterator[Sandbox]:
    key = (stack.home / "dev-api-key").read_text().strip()
    with Orchard(stack.endpoint, key).sandboxes.create() as sb:
        yield sb


def _run_attacker(stack: Stack, victim: Sandbox, uid: int | None) -> dict[str, Any]:
    run = stack.home / "run"
    pki = InternalPKI.of_home(stack.home)
    config = {
        "uid": uid,
        "victim": victim.id,
        "scheduler": (run / "scheduler.addr").read_text().strip(),
        "executor": (run / "executor.addr").read_text().strip(),
        "rewards": (run / "rewards.addr").read_text().strip(),
        "gateway": stack.endpoint,
        "internal_ca": str(pki.ca_file),
        "secret_files": {
            "ca.key": str(pki.ca_key_file),
            "gateway.key": str(pki.key_file("gateway")),
            "scheduler.key": str(pki.key_file("scheduler")),
        },
    }
    result = subprocess.run(
        [sys.executable, "-m", "tests.reliability.internal_attacker", json.dumps(config)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    out: dict[str, Any] = json.loads(result.stdout.strip().splitlines()[-1])
    return out


def _assert_scheduler_refused(calls: dict[str, Any], how: str, code: str, says: str) -> None:
    for name, outcome in calls.items():
        assert outcome["code"] == code, (how, name, outcome)
        assert says in outcome["details"], (how, name, outcome)
        assert "listed" not in outcome and "token" not in outcome, (how, name, outcome)


NO_CREDENTIAL = "this call carries no internal credential ('orchard-internal-identity' metadata"
OTHER_CA = "the certificate was not issued by this deployment's internal CA"


def _assert_every_way_refused(out: dict[str, Any]) -> None:
    # Plaintext to a TLS port: no status can be answered, nothing is served.
    _assert_scheduler_refused(out["scheduler_plaintext"], "plaintext", "UNAVAILABLE", "")
    _assert_scheduler_refused(
        out["scheduler_tls_no_credential"], "TLS, no credential", "UNAUTHENTICATED", NO_CREDENTIAL
    )
    _assert_scheduler_refused(
        out["scheduler_forged_cert"], "its own CA's certificate", "UNAUTHENTICATED", OTHER_CA
    )


def _assert_clients_refused(out: dict[str, Any]) -> None:
    executor, rewards, gateway = out["executor"], out["rewards"], out["gateway"]
    assert executor["code"] == "UNAUTHENTICATED", executor
    assert "authorization: Bearer <token>" in executor["details"], executor
    assert rewards["code"] == "UNAUTHENTICATED", rewards
    assert "API key" in rewards["details"], rewards
    assert gateway["code"] == "UNAUTHENTICATED", gateway


def test_an_unprivileged_local_process_reaches_no_tenant(stack: Stack, victim: Sandbox) -> None:
    out = _run_attacker(stack, victim, NOBODY)
    assert out["uid"] == NOBODY
    _assert_every_way_refused(out)
    # The internal keys are root's: nobody cannot even read them.
    assert out["secrets"] == dict.fromkeys(out["secrets"], "PermissionError"), out["secrets"]
    assert "scheduler_no_client_cert" not in out  # the internal CA is not readable either
    _assert_clients_refused(out)


def test_root_without_the_gateway_certificate_reaches_no_tenant(
    stack: Stack, victim: Sandbox
) -> None:
    out = _run_attacker(stack, victim, None)
    assert out["uid"] == 0
    _assert_every_way_refused(out)
    _assert_scheduler_refused(
        out["scheduler_no_client_cert"], "TLS, the CA file", "UNAUTHENTICATED", NO_CREDENTIAL
    )
    _assert_clients_refused(out)


def test_an_internal_certificate_that_is_not_the_gateway_is_denied(
    stack: Stack, victim: Sandbox
) -> None:
    pki = InternalPKI.of_home(stack.home)
    address = (stack.home / "run" / "scheduler.addr").read_text().strip()
    scheduler = pki.identity("scheduler", issue_missing=False)
    with scheduler.channel("scheduler", address) as channel:
        stub = sandbox_pb2_grpc.SandboxServiceStub(channel)
        with pytest.raises(grpc.RpcError) as denied:
            stub.ListSandboxes(sandbox_pb2.ListSandboxesRequest(), metadata=FORGED, timeout=10)
    assert denied.value.code() == grpc.StatusCode.PERMISSION_DENIED  # type: ignore[attr-defined]
    details = denied.value.details() or ""  # type: ignore[attr-defined]
    assert "the scheduler may not call orchard.v1.SandboxService" in details, details
    assert "allowed: gateway" in details, details
    # The control: the gateway's certificate is admitted, and sees the victim.
    gateway = pki.identity("gateway", issue_missing=False)
    with gateway.channel("scheduler", address) as channel:
        listed = sandbox_pb2_grpc.SandboxServiceStub(channel).ListSandboxes(
            sandbox_pb2.ListSandboxesRequest(), metadata=FORGED, timeout=10
        )
    assert victim.id in [sb.id for sb in listed.sandboxes]


def test_refused_handshakes_do_not_fill_the_logs(stack: Stack, victim: Sandbox) -> None:
    """gRPC core logs each refused handshake at INFO; ``orchard up`` runs the services at
    ERROR, so knocking on the mTLS port writes nothing into the data directory."""
    _run_attacker(stack, victim, NOBODY)
    log = (stack.home / "logs" / "scheduler.log").read_text(errors="replace")
    assert "Handshake failed" not in log


def test_the_internal_keys_are_roots_alone(stack: Stack) -> None:
    pki = InternalPKI.of_home(stack.home)
    assert pki.root.stat().st_mode & 0o777 == 0o700
    for path in (pki.ca_key_file, pki.key_file("gateway"), pki.key_file("scheduler")):
        st = path.stat()
        assert (st.st_uid, st.st_mode & 0o777) == (0, 0o600), path
