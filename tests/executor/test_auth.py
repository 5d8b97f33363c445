"""Every call needs a valid sandbox id and a token for exactly that sandbox."""

from __future__ import annotations

import time

import grpc
import pytest

from orchard._proto.orchard.v1 import executor_pb2 as pb
from orchard.common.tokens import TokenSigner

from .conftest import OTHER_SANDBOX_ID, SANDBOX_ID
from .harness import Client, HostSandbox, error_reason


def _run(client: Client, sandbox_id: str, metadata: tuple[tuple[str, str], ...]) -> pb.RunResponse:
    request = pb.RunRequest(start=pb.ExecStart(sandbox_id=sandbox_id, argv=["true"]))
    response: pb.RunResponse = client.stub.Run(request, metadata=metadata, timeout=10)
    return response


def _refused(
    client: Client, metadata: tuple[tuple[str, str], ...], sandbox_id: str = SANDBOX_ID
) -> None:
    with pytest.raises(grpc.RpcError) as err:
        _run(client, sandbox_id, metadata)
    assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert error_reason(err.value) == "TOKEN_INVALID"


def test_missing_malformed_forged_expired_and_foreign_tokens(
    client: Client, other_sandbox: HostSandbox
) -> None:
    _refused(client, ())
    _refused(client, (("authorization", "Bearer garbage"),))
    _refused(client, (("authorization", "Basic abc"),))
    forged, _ = TokenSigner.from_key(b"k" * 32).issue(SANDBOX_ID, 3600)
    _refused(client, client.metadata(SANDBOX_ID, forged))
    expired, _ = client.signer.issue(SANDBOX_ID, -10)
    _refused(client, client.metadata(SANDBOX_ID, expired))
    foreign, _ = client.signer.issue(OTHER_SANDBOX_ID, 3600)
    _refused(client, client.metadata(SANDBOX_ID, foreign))
    # The right token works, for its own sandbox only.
    assert (
        _run(client, OTHER_SANDBOX_ID, client.metadata(OTHER_SANDBOX_ID, foreign)).status.exit_code
        == 0
    )


def test_session_calls_check_tokens(client: Client) -> None:
    with pytest.raises(grpc.RpcError) as err:
        client.stub.CreateSession(pb.CreateSessionRequest(sandbox_id=SANDBOX_ID), metadata=())
    assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
    with pytest.raises(grpc.RpcError) as err:
        client.stub.SessionRun(
            pb.SessionRunRequest(sandbox_id=SANDBOX_ID, session_id="s-1", command="true"),
            metadata=client.metadata(SANDBOX_ID, "v1.x.1.y"),
        )
    assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED


def test_unknown_and_invalid_sandboxes(client: Client) -> None:
    with pytest.raises(grpc.RpcError) as err:
        _run(client, "sb-does-not-exist", client.metadata("sb-does-not-exist"))
    assert err.value.code() == grpc.StatusCode.NOT_FOUND
    assert error_reason(err.value) == "SANDBOX_NOT_FOUND"
    with pytest.raises(grpc.RpcError) as err:
        _run(client, "../etc", client.metadata("../etc"))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT


def test_a_dead_init_is_an_infrastructure_error(
    client: Client, node_home: object, init_binary: object
) -> None:
    from pathlib import Path

    box = HostSandbox("sb-dies-early", Path(str(node_home)), Path(str(init_binary))).create()
    try:
        assert _run(client, box.sandbox_id, client.metadata(box.sandbox_id)).status.exit_code == 0
        box.stop()
        time.sleep(0.05)
        with pytest.raises(grpc.RpcError) as err:
            _run(client, box.sandbox_id, client.metadata(box.sandbox_id))
        assert err.value.code() == grpc.StatusCode.UNAVAILABLE
        assert ("orchard-fault", "infrastructure") in (err.value.trailing_metadata() or ())  # type: ignore[attr-defined]
    finally:
        box.stop()
