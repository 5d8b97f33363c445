"""The attacker of ``test_hostile_internal_calls``: a local process calling internal services.

``python -m tests.reliability.internal_attacker '<json>'`` imports what it needs as root,
then (``"uid"`` in the JSON) drops to that uid and gid and no groups, as any unprivileged
local process runs; then it calls each service directly with forged ``orchard-tenant`` /
``orchard-quota`` metadata and no credential, in every way it can (plaintext; TLS trusting
the CA certificate the scheduler's handshake sends, with no credential; the same with a
credential signed by a certificate of its own CA that claims to be the gateway),
and prints one JSON object: per attempt, the status code and message it got, or what it
was answered (the sandboxes listed, the token handed out).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import grpc

from orchard._proto.orchard.v1 import (
    executor_pb2,
    executor_pb2_grpc,
    pools_pb2,
    pools_pb2_grpc,
    rewards_pb2,
    rewards_pb2_grpc,
    sandbox_pb2,
    sandbox_pb2_grpc,
)
from orchard.common.internal_pki import ServiceIdentity, identity_name
from orchard.common.local_ca import cert_pem, issue, key_pem, make_ca

FORGED = (("orchard-tenant", "dev"), ("orchard-quota", "max_sandboxes=100000"))
TIMEOUT = 10


def _outcome(call: Any) -> dict[str, Any]:
    try:
        answer = call()
    except grpc.RpcError as err:
        return {"code": err.code().name, "details": err.details() or ""}  # type: ignore[attr-defined]
    if isinstance(answer, sandbox_pb2.ListSandboxesResponse):
        return {"code": "OK", "listed": [sb.id for sb in answer.sandboxes]}
    if isinstance(answer, sandbox_pb2.ExecutorAccess):
        return {"code": "OK", "token": bool(answer.token)}
    return {"code": "OK", "answer": str(answer)[:200]}


def _scheduler_calls(channel: grpc.Channel, victim: str) -> dict[str, Any]:
    sandboxes = sandbox_pb2_grpc.SandboxServiceStub(channel)
    pools = pools_pb2_grpc.PoolServiceStub(channel)
    return {
        "list": _outcome(
            lambda: sandboxes.ListSandboxes(
                sandbox_pb2.ListSandboxesRequest(), metadata=FORGED, timeout=TIMEOUT
            )
        ),
        "access": _outcome(
            lambda: sandboxes.GetExecutorAccess(
                sandbox_pb2.GetSandboxRequest(id=victim), metadata=FORGED, timeout=TIMEOUT
            )
        ),
        "pools": _outcome(
            lambda: pools.ListPools(pools_pb2.ListPoolsRequest(), metadata=FORGED, timeout=TIMEOUT)
        ),
    }


def _forged_gateway_identity() -> ServiceIdentity:
    """A certificate that claims the gateway's name, from a CA the attacker made."""
    ca, ca_key = make_ca("Orchard internal CA")
    leaf, leaf_key = issue(ca, ca_key, [identity_name("gateway")])
    return ServiceIdentity("gateway", cert_pem(leaf), key_pem(leaf_key), cert_pem(ca))


def _served_ca(address: str) -> bytes:
    """The last certificate of the chain the server's TLS handshake sends (no trust needed:
    ``openssl s_client``, as an attacker would)."""
    result = subprocess.run(
        ["openssl", "s_client", "-connect", address, "-showcerts"],
        input=b"",
        capture_output=True,
        timeout=TIMEOUT,
        check=False,
    )
    begin, end = b"-----BEGIN CERTIFICATE-----", b"-----END CERTIFICATE-----"
    last = result.stdout.rfind(begin)
    if last < 0:
        raise RuntimeError(f"no certificate from {address}: {result.stderr[-300:]!r}")
    return result.stdout[last : result.stdout.index(end, last) + len(end)] + b"\n"


def _read(path: str) -> str:
    try:
        Path(path).read_bytes()
    except OSError as err:
        return type(err).__name__
    return "read"


def attack(config: dict[str, Any]) -> dict[str, Any]:
    victim = config["victim"]
    scheduler = config["scheduler"]
    out: dict[str, Any] = {"uid": os.getuid()}
    out["secrets"] = {name: _read(path) for name, path in config["secret_files"].items()}
    with grpc.insecure_channel(scheduler) as plain:
        out["scheduler_plaintext"] = _scheduler_calls(plain, victim)
    served_ca = _served_ca(scheduler)
    options = ServiceIdentity.channel_options("scheduler")
    trusting = grpc.ssl_channel_credentials(root_certificates=served_ca)
    with grpc.secure_channel(scheduler, trusting, options=options) as channel:
        out["scheduler_tls_no_credential"] = _scheduler_calls(channel, victim)
    forged = _forged_gateway_identity()
    forged = ServiceIdentity("gateway", forged.cert_pem, forged.key_pem, served_ca)
    with forged.channel("scheduler", scheduler) as channel:
        out["scheduler_forged_cert"] = _scheduler_calls(channel, victim)
    ca_file = config.get("internal_ca")
    if ca_file and _read(ca_file) == "read":  # root can read the CA: TLS with no certificate
        credentials = grpc.ssl_channel_credentials(root_certificates=Path(ca_file).read_bytes())
        with grpc.secure_channel(scheduler, credentials, options=options) as channel:
            out["scheduler_no_client_cert"] = _scheduler_calls(channel, victim)
    with grpc.insecure_channel(config["executor"]) as channel:
        start = executor_pb2.ExecStart(sandbox_id=victim, argv=["id"], timeout_seconds=5)
        out["executor"] = _outcome(
            lambda: executor_pb2_grpc.ExecutorServiceStub(channel).Run(
                executor_pb2.RunRequest(start=start), metadata=FORGED, timeout=TIMEOUT
            )
        )
    with grpc.insecure_channel(config["rewards"]) as channel:
        out["rewards"] = _outcome(
            lambda: rewards_pb2_grpc.RewardServiceStub(channel).Grade(
                rewards_pb2.GradeRequest(instance_json="{}", output=""),
                metadata=FORGED,
                timeout=TIMEOUT,
            )
        )
    with grpc.insecure_channel(config["gateway"]) as channel:
        out["gateway"] = _outcome(
            lambda: sandbox_pb2_grpc.SandboxServiceStub(channel).ListSandboxes(
                sandbox_pb2.ListSandboxesRequest(), metadata=FORGED, timeout=TIMEOUT
            )
        )
    return out


def main() -> None:
    config = json.loads(sys.argv[1])
    uid = config.get("uid")
    if uid is not None:  # everything is imported: now become an unprivileged process
        os.setgroups([])
        os.setgid(uid)
        os.setuid(uid)
    print(json.dumps(attack(config)), flush=True)


if __name__ == "__main__":
    main()
