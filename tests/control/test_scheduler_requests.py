"""Create/get/list/delete through the gateway: validation, defaults, idempotency, tokens.

Uses the stand-in ``FakeBackend`` (no containers); the runc-marked tests in
test_real_backend.py run the same paths against the real local backend.
"""

from __future__ import annotations

import time

import grpc
import pytest

from orchard._proto.orchard.v1 import common_pb2, sandbox_pb2
from orchard.common.layout import NodeLayout, is_valid_sandbox_id
from orchard.common.tokens import TokenSigner

from .conftest import ControlPlane
from .fake_backend import FakeBackend
from .rpc import code, details, trailers

Mode = common_pb2.NetworkPolicy.Mode


def _error(plane: ControlPlane, request: sandbox_pb2.CreateSandboxRequest) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as info:
        plane.stub.CreateSandbox(request, metadata=plane.auth())
    return info.value


def _reason(err: grpc.RpcError) -> str:
    return trailers(err).get("orchard-reason", "")


def test_create_fills_defaults_and_gives_executor_access(plane: ControlPlane) -> None:
    sb = plane.stub.CreateSandbox(
        sandbox_pb2.CreateSandboxRequest(labels={"a": "1"}), metadata=plane.auth()
    )
    assert is_valid_sandbox_id(sb.id) and sb.id.startswith("sb-") and len(sb.id) == 15
    assert sb.state == sandbox_pb2.READY
    assert (sb.resources.cpu_millis, sb.resources.memory_bytes, sb.resources.pids) == (
        1000,
        1 << 30,
        512,
    )
    assert sb.network.mode == Mode.NONE
    assert 3590 < sb.expires_at.seconds - sb.created_at.seconds <= 3600
    assert sb.executor.address == "127.0.0.1:1"
    signer = TokenSigner(NodeLayout(plane.home).keyring_file())
    signer.verify(sb.executor.token, sb.id)  # raises if invalid
    assert sb.executor.token_expires_at.seconds <= sb.expires_at.seconds


def test_token_is_capped_by_sandbox_expiry(plane: ControlPlane) -> None:
    sb = plane.stub.CreateSandbox(
        sandbox_pb2.CreateSandboxRequest(ttl_seconds=60), metadata=plane.auth()
    )
    assert sb.executor.token_expires_at.seconds <= int(time.time()) + 61
    access = plane.stub.GetExecutorAccess(
        sandbox_pb2.GetSandboxRequest(id=sb.id), metadata=plane.auth()
    )
    assert access.token and access.address == "127.0.0.1:1"


@pytest.mark.parametrize(
    ("request_", "field"),
    [
        (sandbox_pb2.CreateSandboxRequest(image="Bad Image!"), "image"),
        (sandbox_pb2.CreateSandboxRequest(image="x" * 300), "image"),
        (
            sandbox_pb2.CreateSandboxRequest(resources=common_pb2.Resources(cpu_millis=-5)),
            "resources.cpu_millis",
        ),
        (
            sandbox_pb2.CreateSandboxRequest(resources=common_pb2.Resources(cpu_millis=10**9)),
            "resources.cpu_millis",
        ),
        (
            sandbox_pb2.CreateSandboxRequest(resources=common_pb2.Resources(memory_bytes=1024)),
            "resources.memory_bytes",
        ),
        (
            sandbox_pb2.CreateSandboxRequest(resources=common_pb2.Resources(pids=1)),
            "resources.pids",
        ),
        (sandbox_pb2.CreateSandboxRequest(ttl_seconds=-1), "ttl_seconds"),
        (sandbox_pb2.CreateSandboxRequest(ttl_seconds=8 * 24 * 3600), "ttl_seconds"),
        (sandbox_pb2.CreateSandboxRequest(labels={"bad key!": "v"}), "labels"),
        (sandbox_pb2.CreateSandboxRequest(labels={"k": "v" * 1000}), "labels[k]"),
        (sandbox_pb2.CreateSandboxRequest(labels={f"k{i}": "v" for i in range(100)}), "labels"),
        (sandbox_pb2.CreateSandboxRequest(env={"1BAD": "v"}), "env"),
        (sandbox_pb2.CreateSandboxRequest(env={"BIG": "x" * 100_000}), "env[BIG]"),
        (sandbox_pb2.CreateSandboxRequest(request_id="has space"), "request_id"),
        (
            sandbox_pb2.CreateSandboxRequest(
                network=common_pb2.NetworkPolicy(cidrs=["10.0.0.0/8"])
            ),
            "network",
        ),
    ],
)
def test_invalid_fields_are_named(
    plane: ControlPlane, request_: sandbox_pb2.CreateSandboxRequest, field: str
) -> None:
    err = _error(plane, request_)
    assert code(err) == grpc.StatusCode.INVALID_ARGUMENT
    assert details(err).startswith(field), details(err)
    assert _reason(err) == "INVALID_FIELD"


@pytest.mark.parametrize(
    ("policy", "field"),
    [
        (common_pb2.NetworkPolicy(mode=Mode.ALLOWLIST), "at least one cidr or domain"),
        (common_pb2.NetworkPolicy(mode=Mode.ALLOWLIST, cidrs=["10.0.0.1/8"]), "network.cidrs"),
        (common_pb2.NetworkPolicy(mode=Mode.ALLOWLIST, domains=["a b"]), "network.domains"),
        (
            common_pb2.NetworkPolicy(mode=Mode.INTERNET, ports=[80]),
            "only allowed with mode ALLOWLIST",
        ),
    ],
)
def test_bad_network_policies_name_the_field(
    plane: ControlPlane, policy: common_pb2.NetworkPolicy, field: str
) -> None:
    err = _error(plane, sandbox_pb2.CreateSandboxRequest(network=policy))
    assert code(err) == grpc.StatusCode.INVALID_ARGUMENT
    assert field in details(err)


def test_unknown_image_is_a_client_fault(plane: ControlPlane) -> None:
    err = _error(plane, sandbox_pb2.CreateSandboxRequest(image="no-such-image"))
    assert code(err) == grpc.StatusCode.NOT_FOUND
    meta = trailers(err)
    assert meta["orchard-reason"] == "IMAGE_NOT_FOUND" and meta["orchard-fault"] == "client"
    failed = plane.stub.ListSandboxes(
        sandbox_pb2.ListSandboxesRequest(), metadata=plane.auth()
    ).sandboxes
    assert [s.state for s in failed] == [sandbox_pb2.FAILED] and "no-such-image" in failed[
        0
    ].state_reason


def test_backend_failure_is_an_infrastructure_fault(
    plane: ControlPlane, fake_backend: FakeBackend
) -> None:
    fake_backend.fail_next_create = "runc exploded"
    err = _error(plane, sandbox_pb2.CreateSandboxRequest())
    assert code(err) == grpc.StatusCode.UNAVAILABLE
    meta = trailers(err)
    assert meta["orchard-fault"] == "infrastructure" and meta["orchard-reason"] == "BACKEND_FAILURE"
    assert "runc exploded" in details(err)


def test_create_is_idempotent_by_request_id(plane: ControlPlane, fake_backend: FakeBackend) -> None:
    req = sandbox_pb2.CreateSandboxRequest(request_id="job-42/attempt-1")
    first = plane.stub.CreateSandbox(req, metadata=plane.auth())
    again = plane.stub.CreateSandbox(req, metadata=plane.auth())
    assert first.id == again.id and fake_backend.creates == 1
    other = plane.stub.CreateSandbox(
        sandbox_pb2.CreateSandboxRequest(request_id="job-43"), metadata=plane.auth()
    )
    assert other.id != first.id


def test_concurrent_retries_share_one_create(
    tmp_path: object, plane: ControlPlane, fake_backend: FakeBackend
) -> None:
    fake_backend.create_delay = 0.3
    req = sandbox_pb2.CreateSandboxRequest(request_id="same")
    futures = [plane.stub.CreateSandbox.future(req, metadata=plane.auth()) for _ in range(5)]
    ids = {f.result().id for f in futures}
    assert len(ids) == 1 and fake_backend.creates == 1


def test_list_filters_by_labels(plane: ControlPlane) -> None:
    a = plane.stub.CreateSandbox(
        sandbox_pb2.CreateSandboxRequest(labels={"run": "a", "x": "1"}), metadata=plane.auth()
    )
    plane.stub.CreateSandbox(
        sandbox_pb2.CreateSandboxRequest(labels={"run": "b"}), metadata=plane.auth()
    )
    got = plane.stub.ListSandboxes(
        sandbox_pb2.ListSandboxesRequest(labels={"run": "a"}), metadata=plane.auth()
    )
    assert [s.id for s in got.sandboxes] == [a.id]
    assert (
        len(
            plane.stub.ListSandboxes(
                sandbox_pb2.ListSandboxesRequest(), metadata=plane.auth()
            ).sandboxes
        )
        == 2
    )


def test_delete_then_get_and_unknown_ids(plane: ControlPlane, fake_backend: FakeBackend) -> None:
    sb = plane.stub.CreateSandbox(sandbox_pb2.CreateSandboxRequest(), metadata=plane.auth())
    plane.stub.DeleteSandbox(sandbox_pb2.DeleteSandboxRequest(id=sb.id), metadata=plane.auth())
    assert sb.id not in fake_backend.sandboxes
    got = plane.stub.GetSandbox(sandbox_pb2.GetSandboxRequest(id=sb.id), metadata=plane.auth())
    assert got.state == sandbox_pb2.DELETED and not got.HasField("executor")
    plane.stub.DeleteSandbox(
        sandbox_pb2.DeleteSandboxRequest(id=sb.id), metadata=plane.auth()
    )  # again: fine
    assert (
        plane.stub.ListSandboxes(
            sandbox_pb2.ListSandboxesRequest(), metadata=plane.auth()
        ).sandboxes
        == []
    )
    with pytest.raises(grpc.RpcError) as info:
        plane.stub.GetExecutorAccess(sandbox_pb2.GetSandboxRequest(id=sb.id), metadata=plane.auth())
    assert code(info.value) == grpc.StatusCode.FAILED_PRECONDITION
    for bad in ("sb-doesnotexist", "../../etc", "X" * 500):
        with pytest.raises(grpc.RpcError) as info:
            plane.stub.DeleteSandbox(
                sandbox_pb2.DeleteSandboxRequest(id=bad), metadata=plane.auth()
            )
        assert code(info.value) == grpc.StatusCode.NOT_FOUND
        assert _reason(info.value) == "SANDBOX_NOT_FOUND"
    with pytest.raises(grpc.RpcError) as info:
        plane.stub.GetSandbox(sandbox_pb2.GetSandboxRequest(id=""), metadata=plane.auth())
    assert code(info.value) == grpc.StatusCode.INVALID_ARGUMENT


def test_list_images(plane: ControlPlane) -> None:
    images = plane.stub.ListImages(sandbox_pb2.ListImagesRequest(), metadata=plane.auth()).images
    assert [(i.name, i.is_default) for i in images] == [("debian", True)]


def test_ttl_reaper_deletes_expired_sandboxes(
    plane: ControlPlane, fake_backend: FakeBackend
) -> None:
    sb = plane.stub.CreateSandbox(
        sandbox_pb2.CreateSandboxRequest(ttl_seconds=1), metadata=plane.auth()
    )
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        state = plane.stub.GetSandbox(
            sandbox_pb2.GetSandboxRequest(id=sb.id), metadata=plane.auth()
        ).state
        if state == sandbox_pb2.DELETED:
            break
        time.sleep(0.1)
    assert state == sandbox_pb2.DELETED
    assert sb.id not in fake_backend.sandboxes


def test_a_model_endpoint_is_refused_where_the_backend_has_none(plane: ControlPlane) -> None:
    """A backend without the MODEL_ENDPOINT capability (this stand-in, Kubernetes) refuses it
    before anything is created, naming the field; without the option nothing changes."""
    err = _error(plane, sandbox_pb2.CreateSandboxRequest(model_endpoint=True))
    assert code(err) == grpc.StatusCode.INVALID_ARGUMENT
    assert "model_endpoint" in details(err) and "cannot give a sandbox" in details(err)
    sb = plane.stub.CreateSandbox(sandbox_pb2.CreateSandboxRequest(), metadata=plane.auth())
    assert sb.model_endpoint == ""
