"""The scheduler's revocation notices to real injected executors (``scheduler/revocations.py``),
for the cases the live stack test cannot stage: a scheduler (re)started after the
revocation, a create in flight at the moment, and hostile notices. The same for
key-drop notices (``scheduler/key_drops.py``): a scheduler started after the drop,
a sandbox left holding no live key, hostile notices.

A real runc sandbox runs its own executor from the bundle (the ``node`` fixture),
the scheduler side is a real store with the sandbox's record and a fresh
``SandboxRevocations`` (what a scheduler has right after its start: it has seen
no moment yet).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from orchard.scheduler.key_drops import SandboxKeyDrops
from orchard.scheduler.revocations import SandboxRevocations
from orchard.scheduler.store import SandboxRecord, SandboxStore, State

from orchard._proto.orchard.v1 import executor_pb2 as pb
from orchard.common.tokens import KeyringFile, Revocations, TokenSigner
from tests.executor.harness import Client, error_reason
from tests.executor.test_key_drop_notices import hostile_drops

from .conftest import InjectedNode

pytestmark = [pytest.mark.runc, pytest.mark.reliability]

RESTART_ID = "sb-rev-restart"
INFLIGHT_ID = "sb-rev-inflight"
HOSTILE_ID = "sb-rev-hostile"
NEIGHBOUR_ID = "sb-rev-neighbour"
DROP_ID = "sb-drop-restart"
DROP_LONELY_ID = "sb-drop-lonely"
DROP_HOSTILE_ID = "sb-drop-hostile"


@pytest.fixture(scope="module")
def image() -> str:
    """One image is enough here (the notices do not depend on it)."""
    return "debian"


@pytest.fixture
def store(tmp_path: Path) -> Iterator[SandboxStore]:
    made = SandboxStore(tmp_path / "state.db")
    yield made
    made.close()


def record(sandbox_id: str, tenant: str, state: State, address: str) -> SandboxRecord:
    now = time.time()
    return SandboxRecord(
        id=sandbox_id, tenant=tenant, image="", cpu_millis=1000, memory_bytes=512 << 20,
        pids=512, network_mode=0, ttl_seconds=600, created_at=now, expires_at=now + 600,
        state=state, executor_address=address,
    )  # fmt: skip


def pusher(node: InjectedNode, store: SandboxStore, removed: list[str]) -> SandboxRevocations:
    async def remove(sandbox_id: str, why: str) -> None:
        removed.append(sandbox_id)

    return SandboxRevocations(
        node.backend.layout.revocations,
        TokenSigner(node.backend.layout.keyring_file()),
        store,
        remove,
        interval_seconds=0.5,
        give_up_seconds=30.0,
    )


def run(client: Client, sandbox_id: str, token: str) -> grpc.StatusCode:
    request = pb.RunRequest(start=pb.ExecStart(sandbox_id=sandbox_id, argv=["true"]))
    try:
        client.stub.Run(request, metadata=client.metadata(sandbox_id, token), timeout=20)
    except grpc.RpcError as err:
        assert error_reason(err) == "TOKEN_INVALID", err
        return err.code()  # type: ignore[no-any-return]
    return grpc.StatusCode.OK


def test_a_scheduler_started_after_the_revocation_tells_the_sandbox(
    node: InjectedNode, store: SandboxStore
) -> None:
    address = node.create(RESTART_ID)
    rec = record(RESTART_ID, "alice", State.READY, address)
    store.insert(rec)
    client = Client(address, node.home)
    signer = TokenSigner(node.backend.layout.keyring_file())
    token, _ = signer.issue(RESTART_ID, 600, tenant="alice", created=rec.created_at)
    try:
        assert run(client, RESTART_ID, token) == grpc.StatusCode.OK
        time.sleep(0.01)
        # Revoked while no scheduler watched: the executor still takes the old token.
        Revocations.revoke(node.backend.layout.revocations, "alice")
        assert run(client, RESTART_ID, token) == grpc.StatusCode.OK
        removed: list[str] = []
        fresh = pusher(node, store, removed)
        first = node.loop.run_until_complete(fresh.push_once())
        assert (first.delivered, first.failed, removed) == (1, [], [])
        assert run(client, RESTART_ID, token) == grpc.StatusCode.UNAUTHENTICATED
        # Told once: the next passes send nothing; a token issued now works.
        assert node.loop.run_until_complete(fresh.push_once()).delivered == 0
        again, _ = signer.issue(RESTART_ID, 600, tenant="alice", created=rec.created_at)
        assert run(client, RESTART_ID, again) == grpc.StatusCode.OK
    finally:
        client.close()
        node.delete(RESTART_ID)


def test_a_create_in_flight_at_the_moment_is_told_once_usable(
    node: InjectedNode, store: SandboxStore
) -> None:
    rec = record(INFLIGHT_ID, "bob", State.PENDING, "")
    store.insert(rec)
    removed: list[str] = []
    watching = pusher(node, store, removed)
    address = node.create(INFLIGHT_ID)  # the backend's create, still PENDING in the store
    signer = TokenSigner(node.backend.layout.keyring_file())
    token, _ = signer.issue(INFLIGHT_ID, 600, tenant="bob", created=rec.created_at)
    client = Client(address, node.home)
    try:
        time.sleep(0.01)
        Revocations.revoke(node.backend.layout.revocations, "bob")
        pending = node.loop.run_until_complete(watching.push_once())
        assert pending.delivered == 0  # no address yet: asked about again next pass
        store.set_executor_address(INFLIGHT_ID, address)
        store.set_state(INFLIGHT_ID, State.READY)
        told = node.loop.run_until_complete(watching.push_once())
        assert (told.delivered, removed) == (1, [])
        assert run(client, INFLIGHT_ID, token) == grpc.StatusCode.UNAUTHENTICATED
    finally:
        client.close()
        node.delete(INFLIGHT_ID)


def test_hostile_notices_are_refused_and_change_nothing(node: InjectedNode) -> None:
    """Random, forged, oversized and future-dated notices, a notice signed with another key,
    and another sandbox's real notice: each UNAUTHENTICATED REVOCATION_INVALID, and the
    sandbox's tokens keep working."""
    address = node.create(HOSTILE_ID)
    node.create(NEIGHBOUR_ID)
    client = Client(address, node.home)
    signer = TokenSigner(node.backend.layout.keyring_file())
    stranger = TokenSigner.from_key(b"s" * 32)
    token, _ = signer.issue(HOSTILE_ID, 600, tenant="carol")
    time.sleep(0.01)
    now = time.time()  # the moment the real notice voids: after the token
    real = signer.sign_revocation(HOSTILE_ID, "carol", now)
    body, sig = real.rsplit(".", 1)
    hostile = {
        "empty": "",
        "random": "r1.k1.x.y.z.w",
        "not a notice": token,
        "oversized": "r1." + "A" * 100_000,
        "flipped signature": f"{body}.{'A' if sig[0] != 'A' else 'B'}{sig[1:]}",
        "another key": stranger.sign_revocation(HOSTILE_ID, "carol", now),
        "dated ahead": signer.sign_revocation(HOSTILE_ID, "carol", now + 3600),
        "for the neighbour": signer.sign_revocation(NEIGHBOUR_ID, "carol", now),
        "non-ascii": real.replace("r1", "r\u0661"),
    }
    try:
        for what, notice in hostile.items():
            with pytest.raises(grpc.RpcError) as err:
                client.stub.Revoke(
                    pb.RevokeRequest(sandbox_id=HOSTILE_ID, notice=notice), timeout=20
                )
            assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED, what
            assert error_reason(err.value) == "REVOCATION_INVALID", what
            assert run(client, HOSTILE_ID, token) == grpc.StatusCode.OK, what
        # Under the neighbour's id: this sandbox's real notice (it names its sandbox), and the
        # neighbour's real one (this executor holds no key of the neighbour's).
        neighbours = signer.sign_revocation(NEIGHBOUR_ID, "carol", now)
        for notice in (real, neighbours):
            with pytest.raises(grpc.RpcError) as err:
                client.stub.Revoke(
                    pb.RevokeRequest(sandbox_id=NEIGHBOUR_ID, notice=notice), timeout=20
                )
            assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
            assert error_reason(err.value) == "REVOCATION_INVALID"
        assert run(client, HOSTILE_ID, token) == grpc.StatusCode.OK
        # And the real one works (the refusals above were not of every notice).
        client.stub.Revoke(pb.RevokeRequest(sandbox_id=HOSTILE_ID, notice=real), timeout=20)
        assert run(client, HOSTILE_ID, token) == grpc.StatusCode.UNAUTHENTICATED
    finally:
        client.close()
        node.delete(HOSTILE_ID)
        node.delete(NEIGHBOUR_ID)


def key_drops(node: InjectedNode, store: SandboxStore, removed: list[str]) -> SandboxKeyDrops:
    async def remove(sandbox_id: str, why: str) -> None:
        assert "token key" in why
        removed.append(sandbox_id)

    return SandboxKeyDrops(
        TokenSigner(node.backend.layout.keyring_file()),
        store,
        remove,
        interval_seconds=0.5,
        give_up_seconds=30.0,
    )


def rotate(node: InjectedNode, *drop: str) -> str:
    kid = KeyringFile(node.backend.layout.token_keyring).rotate(drop=drop)
    time.sleep(0.01)
    return kid


def test_a_scheduler_started_after_a_key_drop_tells_the_sandbox(
    node: InjectedNode, store: SandboxStore
) -> None:
    """The sandbox holds two keys; its token's key is dropped while no scheduler watched. A
    scheduler started then tells it on its first pass (signed with the other key): the old
    token is refused, a fresh one works. Another sandbox holding only dropped keys (made
    before every live key) cannot be told and is removed."""
    rotate(node)
    rec = record(DROP_ID, "dave", State.READY, "")
    address = node.create(DROP_ID)
    store.insert(rec)
    store.set_executor_address(DROP_ID, address)
    lonely = record(DROP_LONELY_ID, "dave", State.READY, "unix:/nonexistent/executor.sock")
    store.insert(dataclasses.replace(lonely, created_at=1.0))  # before every key of the ring
    client = Client(address, node.home)
    signer = TokenSigner(node.backend.layout.keyring_file())
    token, _ = signer.issue(DROP_ID, 600, tenant="dave", created=rec.created_at)
    try:
        assert run(client, DROP_ID, token) == grpc.StatusCode.OK
        rotate(node, token.split(".")[1])
        assert run(client, DROP_ID, token) == grpc.StatusCode.OK  # nobody told it yet
        removed: list[str] = []
        fresh = key_drops(node, store, removed)
        first = node.loop.run_until_complete(fresh.push_once())
        assert (first.delivered, first.failed, removed) == (1, [], [DROP_LONELY_ID])
        assert run(client, DROP_ID, token) == grpc.StatusCode.UNAUTHENTICATED
        assert node.loop.run_until_complete(fresh.push_once()).delivered == 0
        again, _ = TokenSigner(node.backend.layout.keyring_file()).issue(
            DROP_ID, 600, tenant="dave", created=rec.created_at
        )
        assert again.split(".")[1] != token.split(".")[1]
        assert run(client, DROP_ID, again) == grpc.StatusCode.OK
    finally:
        client.close()
        node.delete(DROP_ID)


def test_hostile_key_drop_notices_are_refused_and_remove_nothing(node: InjectedNode) -> None:
    """Forged, oversized, another sandbox's, signed with the key it drops or with a key
    dropped already: each UNAUTHENTICATED REVOCATION_INVALID, and the token of the live key
    keeps working; the real notice is taken."""
    rotate(node)
    created = time.time()
    address = node.create(DROP_HOSTILE_ID)
    signer = TokenSigner(node.backend.layout.keyring_file())
    held = signer.sandbox_keys_for(DROP_HOSTILE_ID)
    newer = signer.ring.ring().current
    token, _ = signer.issue(DROP_HOSTILE_ID, 600, tenant="erin", created=created)
    older = signer.ring.ring().live_kid_held(created, besides=newer)
    assert older is not None and token.split(".")[1] == newer
    client = Client(address, node.home)

    def revoke(notice: str) -> None:
        client.stub.Revoke(pb.RevokeRequest(sandbox_id=DROP_HOSTILE_ID, notice=notice), timeout=20)

    try:
        rotate(node, newer)
        signer.ring.ring(force=True)
        revoke(signer.sign_key_drop(DROP_HOSTILE_ID, newer, created=created))
        assert run(client, DROP_HOSTILE_ID, token) == grpc.StatusCode.UNAUTHENTICATED
        live, _ = signer.issue(DROP_HOSTILE_ID, 600, tenant="erin", created=created)
        assert live.split(".")[1] == older
        hostile = hostile_drops(signer, held, older, newer, created, DROP_HOSTILE_ID, NEIGHBOUR_ID)
        for what, notice in hostile.items():
            with pytest.raises(grpc.RpcError) as err:
                revoke(notice)
            assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED, what
            assert error_reason(err.value) == "REVOCATION_INVALID", what
            assert run(client, DROP_HOSTILE_ID, live) == grpc.StatusCode.OK, what
    finally:
        client.close()
        node.delete(DROP_HOSTILE_ID)
