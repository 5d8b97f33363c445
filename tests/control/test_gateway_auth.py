"""Gateway authentication and tenant isolation (stand-in backend: no containers needed)."""

from __future__ import annotations

import hashlib
import json
import os
import stat
from collections.abc import Callable

import grpc
import pytest

from orchard._proto.orchard.v1 import sandbox_pb2, sandbox_pb2_grpc
from orchard.common.internal_pki import InternalPKI

from .conftest import ControlPlane
from .rpc import code, trailers


def test_dev_key_file_is_private_and_stored_hashed(plane: ControlPlane) -> None:
    key_file = plane.home / "dev-api-key"
    assert stat.S_IMODE(os.stat(key_file).st_mode) == 0o600
    keys = json.loads((plane.home / "api_keys.json").read_text())
    assert keys == {"dev": [hashlib.sha256(plane.api_key.encode()).hexdigest()]}
    assert plane.api_key not in (plane.home / "api_keys.json").read_text()


@pytest.mark.parametrize(
    "metadata",
    [
        (),
        (("authorization", "Bearer nope"),),
        (("authorization", "Basic abc"),),
        (("authorization", "Bearer "),),
    ],
)
def test_missing_or_wrong_key_is_unauthenticated(
    plane: ControlPlane, metadata: tuple[tuple[str, str], ...]
) -> None:
    with pytest.raises(grpc.RpcError) as info:
        plane.stub.ListSandboxes(sandbox_pb2.ListSandboxesRequest(), metadata=metadata)
    assert code(info.value) == grpc.StatusCode.UNAUTHENTICATED
    assert trailers(info.value)["orchard-reason"] == "API_KEY_INVALID"
    assert trailers(info.value)["orchard-fault"] == "client"


def test_client_cannot_forge_tenant_header(plane: ControlPlane) -> None:
    """The gateway sets orchard-tenant itself; a client's own value is ignored."""
    made = plane.stub.CreateSandbox(sandbox_pb2.CreateSandboxRequest(), metadata=plane.auth())
    assert made.tenant == "dev"
    forged = (*plane.auth(), ("orchard-tenant", "other"))
    got = plane.stub.GetSandbox(sandbox_pb2.GetSandboxRequest(id=made.id), metadata=forged)
    assert got.tenant == "dev"


def test_tenants_only_see_their_own_sandboxes(plane: ControlPlane) -> None:
    keys_path = plane.home / "api_keys.json"
    keys = json.loads(keys_path.read_text())
    keys["acme"] = [hashlib.sha256(b"acme-key").hexdigest()]
    keys_path.write_text(json.dumps(keys))  # picked up without a restart
    mine = plane.stub.CreateSandbox(
        sandbox_pb2.CreateSandboxRequest(labels={"who": "dev"}), metadata=plane.auth()
    )
    theirs = plane.stub.CreateSandbox(
        sandbox_pb2.CreateSandboxRequest(), metadata=plane.auth("acme-key")
    )
    assert theirs.tenant == "acme"
    listed = plane.stub.ListSandboxes(
        sandbox_pb2.ListSandboxesRequest(), metadata=plane.auth("acme-key")
    )
    assert [s.id for s in listed.sandboxes] == [theirs.id]
    other = plane.auth("acme-key")
    attempts: list[Callable[[], object]] = [
        lambda: plane.stub.GetSandbox(sandbox_pb2.GetSandboxRequest(id=mine.id), metadata=other),
        lambda: plane.stub.DeleteSandbox(
            sandbox_pb2.DeleteSandboxRequest(id=mine.id), metadata=other
        ),
        lambda: plane.stub.GetExecutorAccess(
            sandbox_pb2.GetSandboxRequest(id=mine.id), metadata=other
        ),
    ]
    for attempt in attempts:
        with pytest.raises(grpc.RpcError) as info:
            attempt()
        assert code(info.value) == grpc.StatusCode.NOT_FOUND
        assert trailers(info.value)["orchard-reason"] == "SANDBOX_NOT_FOUND"
    # still there for its owner
    assert (
        plane.stub.GetSandbox(
            sandbox_pb2.GetSandboxRequest(id=mine.id), metadata=plane.auth()
        ).state
        == sandbox_pb2.READY
    )


def test_scheduler_refuses_calls_without_a_tenant(plane: ControlPlane) -> None:
    # Even the gateway's own certificate (the one caller the scheduler admits) needs a tenant.
    gateway = InternalPKI.of_home(plane.home).identity("gateway")
    with (
        gateway.channel("scheduler", plane.scheduler.address) as ch,
        pytest.raises(grpc.RpcError) as info,
    ):
        sandbox_pb2_grpc.SandboxServiceStub(ch).ListSandboxes(sandbox_pb2.ListSandboxesRequest())
    assert code(info.value) == grpc.StatusCode.UNAUTHENTICATED
