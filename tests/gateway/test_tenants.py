"""Tenants and tokens, attacked through the real gateway and the real executor."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable

import grpc
import pytest

from orchard._proto.orchard.v1 import executor_pb2 as epb
from orchard._proto.orchard.v1 import executor_pb2_grpc as epb_grpc
from orchard._proto.orchard.v1 import sandbox_pb2 as spb
from orchard.common.layout import NodeLayout
from orchard.common.tokens import TokenSigner
from tests.control.rpc import code, trailers

from .conftest import GatewayStack

pytestmark = pytest.mark.runc


def auth(key: str) -> tuple[tuple[str, str], ...]:
    return (("authorization", f"Bearer {key}"),)


def run(channel: grpc.Channel, sandbox_id: str, token: str) -> epb.RunResponse:
    stub = epb_grpc.ExecutorServiceStub(channel)
    start = epb.ExecStart(sandbox_id=sandbox_id, argv=["echo", "hi"])
    response: epb.RunResponse = stub.Run(
        epb.RunRequest(start=start), metadata=auth(token), timeout=30
    )
    return response


def refused(call: Callable[[], object]) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as info:
        call()
    return info.value


def test_tenant_cli_keys_are_hashed_shown_once_and_rotate_and_revoke(gw: GatewayStack) -> None:
    key = gw.new_tenant("cli-team")
    assert key.startswith("ork_")
    stored = json.loads((gw.home / "api_keys.json").read_text())
    assert stored["cli-team"] == [hashlib.sha256(key.encode()).hexdigest()]
    assert key not in (gw.home / "api_keys.json").read_text()
    assert gw.tenant("create", "cli-team").returncode == 1  # no duplicate names
    assert gw.tenant("create", "bad/name").returncode == 1
    listed = [json.loads(line) for line in gw.tenant("ls", "--json").stdout.splitlines()]
    assert {"tenant": "cli-team", "keys": 1, "quota": {}} in listed

    ok = gw.control.ListSandboxes(spb.ListSandboxesRequest(), metadata=auth(key))
    assert list(ok.sandboxes) == []
    new_key = gw.tenant("rotate-key", "cli-team").stdout.strip()
    assert new_key != key
    err = refused(lambda: gw.control.ListSandboxes(spb.ListSandboxesRequest(), metadata=auth(key)))
    assert code(err) == grpc.StatusCode.UNAUTHENTICATED
    gw.control.ListSandboxes(spb.ListSandboxesRequest(), metadata=auth(new_key))
    assert gw.tenant("revoke", "cli-team").returncode == 0
    err = refused(
        lambda: gw.control.ListSandboxes(spb.ListSandboxesRequest(), metadata=auth(new_key))
    )
    assert code(err) == grpc.StatusCode.UNAUTHENTICATED
    assert trailers(err)["orchard-reason"] == "API_KEY_INVALID"
    assert "revoked" in gw.tenant("ls").stdout


def test_a_tenant_cannot_touch_another_tenants_sandbox(gw: GatewayStack) -> None:
    alice, bob = gw.new_tenant("alice"), gw.new_tenant("bob")
    a_box = gw.control.CreateSandbox(spb.CreateSandboxRequest(), metadata=auth(alice), timeout=60)
    b_box = gw.control.CreateSandbox(spb.CreateSandboxRequest(), metadata=auth(bob), timeout=60)
    try:
        assert a_box.tenant == "alice" and b_box.tenant == "bob"
        # Control plane: bob sees nothing of alice's sandbox.
        listed = gw.control.ListSandboxes(spb.ListSandboxesRequest(), metadata=auth(bob))
        assert [s.id for s in listed.sandboxes] == [b_box.id]
        for call in (
            lambda: gw.control.GetSandbox(spb.GetSandboxRequest(id=a_box.id), metadata=auth(bob)),
            lambda: gw.control.GetExecutorAccess(
                spb.GetSandboxRequest(id=a_box.id), metadata=auth(bob)
            ),
            lambda: gw.control.DeleteSandbox(
                spb.DeleteSandboxRequest(id=a_box.id), metadata=auth(bob)
            ),
        ):
            err = refused(call)
            assert code(err) == grpc.StatusCode.NOT_FOUND
            assert trailers(err)["orchard-reason"] == "SANDBOX_NOT_FOUND"

        # Data plane: bob's token (for his own sandbox) opens nothing of alice's.
        with grpc.insecure_channel(a_box.executor.address) as executor:
            assert run(executor, a_box.id, a_box.executor.token).stdout == b"hi\n"
            assert run(executor, b_box.id, b_box.executor.token).stdout == b"hi\n"
            files = epb_grpc.ExecutorServiceStub(executor)
            attacks: list[Callable[[], object]] = [
                lambda: run(executor, a_box.id, b_box.executor.token),
                lambda: list(
                    files.ReadFile(
                        epb.ReadFileRequest(sandbox_id=a_box.id, path="/etc/hostname"),
                        metadata=auth(b_box.executor.token),
                    )
                ),
                lambda: files.CreateSession(
                    epb.CreateSessionRequest(sandbox_id=a_box.id),
                    metadata=auth(b_box.executor.token),
                ),
                lambda: list(
                    files.Download(
                        epb.DownloadRequest(sandbox_id=a_box.id, path="/etc"),
                        metadata=auth(b_box.executor.token),
                    )
                ),
            ]
            for attack in attacks:
                err = refused(attack)
                assert code(err) == grpc.StatusCode.UNAUTHENTICATED
                assert trailers(err)["orchard-reason"] == "TOKEN_INVALID"
    finally:
        gw.control.DeleteSandbox(spb.DeleteSandboxRequest(id=a_box.id), metadata=auth(alice))
        gw.control.DeleteSandbox(spb.DeleteSandboxRequest(id=b_box.id), metadata=auth(bob))


def test_wrong_expired_and_forged_tokens_are_refused(gw: GatewayStack) -> None:
    key = gw.new_tenant("token-attacks")
    box = gw.control.CreateSandbox(spb.CreateSandboxRequest(), metadata=auth(key), timeout=60)
    try:
        token = box.executor.token
        version, kid, sandbox, tenant, max_execs, issued, expiry, signature = token.split(".")
        assert (version, sandbox) == ("v3", box.id)
        node_signer = TokenSigner(NodeLayout(gw.home).keyring_file())
        assert node_signer.verify(token, box.id).tenant == "token-attacks"

        def forge(**fields: str) -> str:
            parts = {"version": version, "kid": kid, "sandbox": sandbox, "tenant": tenant,
                     "max_execs": max_execs, "issued": issued, "expiry": expiry}  # fmt: skip
            return ".".join([*{**parts, **fields}.values(), signature])

        forged_tenant = forge(tenant="ZGV2")
        longer = forge(expiry=str(int(expiry) + 9999))
        more_execs = forge(max_execs=str(int(max_execs) + 7))
        reissued = forge(issued=str(int(issued) + 5))
        other_kid = forge(kid="k1")
        other_key, _ = TokenSigner.from_key(b"x" * 32).issue(box.id, 600, tenant="token-attacks")
        expired, _ = node_signer.issue(box.id, -5, tenant="token-attacks")
        with grpc.insecure_channel(box.executor.address) as executor:
            for bad in (
                "",
                "garbage",
                forged_tenant,
                longer,
                more_execs,
                reissued,
                other_kid,
                other_key,
                expired,
                token + "x",
                "v1.x.1.y",
            ):
                err = refused(lambda bad=bad: run(executor, box.id, bad))  # type: ignore[misc]
                assert code(err) == grpc.StatusCode.UNAUTHENTICATED, bad
                assert trailers(err)["orchard-reason"] == "TOKEN_INVALID"
            assert run(executor, box.id, token).stdout == b"hi\n"
    finally:
        gw.control.DeleteSandbox(spb.DeleteSandboxRequest(id=box.id), metadata=auth(key))
