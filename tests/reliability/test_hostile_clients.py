"""Hostile clients against a real ``orchard up``: every public RPC, random and broken requests.

Requests are generated from the proto descriptors (``fuzz/proto_strategies.py``),
sent over real gRPC to the gateway (SandboxService, PoolService), the node
executor (ExecutorService) and the rewards service (RewardService). Each call
must get a *clear* answer (``fuzz/harness.py``), refused calls must change
nothing (the scheduler's rows and the sandbox folders, and a marker sandbox of
another tenant), and a control exec must succeed after every batch. Counts go
to ``build/reliability/*.json`` and stdout for docs/reliability.md.

Token forgery in detail is in tests/gateway/test_tenants.py, path escapes in
tests/executor/files/; here those show up as random ids, keys and paths.
"""

from __future__ import annotations

import json
import os
import secrets
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import grpc
import pytest
from google.protobuf.descriptor import MethodDescriptor, ServiceDescriptor
from google.protobuf.message import Message
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from orchard import Orchard, Sandbox
from orchard._proto.orchard.v1 import executor_pb2, pools_pb2, rewards_pb2, sandbox_pb2
from orchard.common.layout import NodeLayout
from orchard.common.tokens import TokenSigner, _mac
from tests.stack import REQUIRES_STACK, Stack, running_stack

from .fuzz.bench_tiny_chunks import start_attacker
from .fuzz.harness import (
    REFUSALS,
    REFUSED_IMAGE_PREFIX,
    Outcome,
    Tally,
    bearer,
    call_raw,
    failed_rows,
    fd_count,
    latencies,
    p50_ms,
    rss_kib,
    service_pid,
    state_snapshot,
)
from .fuzz.proto_strategies import messages, raw_messages

pytestmark = [*REQUIRES_STACK, pytest.mark.reliability]

EXAMPLES = int(os.environ.get("ORCHARD_HOSTILE_EXAMPLES", "60"))
SANDBOX_SERVICE = sandbox_pb2.DESCRIPTOR.services_by_name["SandboxService"]
POOL_SERVICE = pools_pb2.DESCRIPTOR.services_by_name["PoolService"]
EXECUTOR_SERVICE = executor_pb2.DESCRIPTOR.services_by_name["ExecutorService"]
REWARD_SERVICE = rewards_pb2.DESCRIPTOR.services_by_name["RewardService"]
ALL_SERVICES = [SANDBOX_SERVICE, POOL_SERVICE, EXECUTOR_SERVICE, REWARD_SERVICE]
ALL_TYPES = [m.input_type for s in ALL_SERVICES for m in s.methods]
FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=None,
    database=None,
    suppress_health_check=list(HealthCheck),
)


@dataclass
class World:
    stack: Stack
    key: str
    mallory_key: str
    victim: Sandbox  # the dev tenant's sandbox: the control client's
    foreign: Sandbox  # another tenant's: must never be touched by the dev tenant
    victim_token: str
    foreign_token: str
    gateway: grpc.Channel
    executor: grpc.Channel
    rewards: grpc.Channel
    executor_address: str

    def executor_target(self) -> str:
        return self.executor_address

    def control(self) -> None:
        """The control client: must be served after every hostile batch."""
        r = self.victim.exec(["echo", "control"], timeout=20)
        assert r.stdout == b"control\n", r

    def foreign_state(self) -> bytes:
        return self.foreign.exec("ls -la --time-style=+%s /tmp; cat /tmp/marker").stdout


# The executor refuses a stream past this many messages under 4 KiB (default 16,384; smaller
# here so the tiny-chunk attack, paced at 1000/s, is refused in ~5 s instead of ~16 s).
MAX_SMALL_MESSAGES = 5_000


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    saved = os.environ.get("ORCHARD_MAX_SMALL_MESSAGES")
    os.environ["ORCHARD_MAX_SMALL_MESSAGES"] = str(MAX_SMALL_MESSAGES)
    try:
        yield from _world(tmp_path_factory)
    finally:
        if saved is None:
            os.environ.pop("ORCHARD_MAX_SMALL_MESSAGES", None)
        else:
            os.environ["ORCHARD_MAX_SMALL_MESSAGES"] = saved


def _world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    with running_stack(tmp_path_factory.mktemp("hostile-clients") / "home") as stack:
        key = (stack.home / "dev-api-key").read_text().strip()
        made = stack.cli("tenant", "create", "mallory", check=True)
        mallory_key = made.stdout.strip()
        victim = Orchard(stack.endpoint, key).sandboxes.create(ttl=900)
        foreign = Orchard(stack.endpoint, mallory_key).sandboxes.create(ttl=900)
        foreign.write_file("/tmp/marker", b"mallory's\n")
        gateway = grpc.insecure_channel(stack.endpoint)
        control = sandbox_pb2_grpc_stub(gateway)
        victim_access = control.GetExecutorAccess(
            sandbox_pb2.GetSandboxRequest(id=victim.id), metadata=bearer(key), timeout=30
        )
        foreign_access = control.GetExecutorAccess(
            sandbox_pb2.GetSandboxRequest(id=foreign.id), metadata=bearer(mallory_key), timeout=30
        )
        rewards_address = (stack.home / "run" / "rewards.addr").read_text().strip()
        world = World(
            stack,
            key,
            mallory_key,
            victim,
            foreign,
            victim_access.token,
            foreign_access.token,
            gateway,
            grpc.insecure_channel(victim_access.address),
            grpc.insecure_channel(rewards_address),
            victim_access.address,
        )
        try:
            yield world
        finally:
            for channel in (world.gateway, world.executor, world.rewards):
                channel.close()
            victim.delete()
            foreign.delete()


def sandbox_pb2_grpc_stub(channel: grpc.Channel) -> Any:
    from orchard._proto.orchard.v1 import sandbox_pb2_grpc

    return sandbox_pb2_grpc.SandboxServiceStub(channel)


def _forged_keys() -> st.SearchStrategy[tuple[tuple[str, str], ...]]:
    return st.one_of(
        st.just(()),
        st.builds(
            lambda k: bearer(k),
            st.text(max_size=80).filter(lambda k: "\n" not in k and "\r" not in k),
        ),
        st.just(bearer("ork_" + "0" * 40)),
        st.just((("authorization", "Basic YWxhZGRpbjpvcGVuc2VzYW1l"),)),
        st.builds(lambda n: bearer("x" * n), st.integers(1000, 6000)),
    )


def _ascii_metadata_ok(metadata: tuple[tuple[str, str], ...]) -> bool:
    return all(v.isascii() and v.isprintable() for _, v in metadata)


def _set_ids(message: Message, sandbox_id: str) -> None:
    """Point every ``sandbox_id``/``id`` field (at any depth) at ``sandbox_id``."""
    for field in message.DESCRIPTOR.fields:
        if (
            field.name in ("sandbox_id", "id")
            and field.type == field.TYPE_STRING
            and not field.is_repeated
        ):
            setattr(message, field.name, sandbox_id)
        elif (
            field.type == field.TYPE_MESSAGE
            and not field.is_repeated
            and message.HasField(field.name)
        ):
            _set_ids(getattr(message, field.name), sandbox_id)


def _fuzz_method(
    world: World,
    tally: Tally,
    channel: grpc.Channel,
    method: MethodDescriptor,
    metadata_strategy: st.SearchStrategy[tuple[tuple[str, str], ...]],
    ids: st.SearchStrategy[str | None],
    must_refuse: bool,
) -> None:
    @FUZZ
    @given(
        requests=st.lists(
            messages(method.input_type), min_size=1, max_size=3 if method.client_streaming else 1
        ),
        metadata=metadata_strategy,
        sandbox_id=ids,
    )
    def one(
        requests: list[Message], metadata: tuple[tuple[str, str], ...], sandbox_id: str | None
    ) -> None:
        if not _ascii_metadata_ok(metadata):
            metadata = bearer("not-ascii")
        if sandbox_id is not None:
            for request in requests:
                _set_ids(request, sandbox_id)
        if method.name == "CreateSandbox":
            for request in requests:  # never the default image: a valid create is not an attack
                request.image = f"{REFUSED_IMAGE_PREFIX}-{secrets.token_hex(4)}"  # type: ignore[attr-defined]
        outcome = call_raw(channel, method, [r.SerializeToString() for r in requests], metadata)
        tally.add(method.name, outcome, repr(requests[0])[:120])
        if must_refuse:
            assert outcome.code in REFUSALS, (method.name, outcome, requests[0])

    one()


def _check_unchanged(world: World, before: Any, foreign_before: bytes) -> None:
    assert state_snapshot(world.stack.home) == before
    assert world.foreign_state() == foreign_before
    world.control()


def test_control_plane_rpcs_with_random_fields(world: World) -> None:
    """SandboxService and PoolService: forged keys (all refused) and the dev key with random
    or foreign ids (clear answers). Nothing is created, changed or deleted."""
    tally = Tally("clients-control-plane-fields")
    before, foreign_before = state_snapshot(world.stack.home), world.foreign_state()
    random_ids = st.one_of(st.just(world.foreign.id), st.text(max_size=30), st.none())
    for service in (SANDBOX_SERVICE, POOL_SERVICE):
        for method in service.methods:
            _fuzz_method(
                world, tally, world.gateway, method, _forged_keys(), random_ids, must_refuse=True
            )
            if method.name in (
                "DeleteSandbox",
                "KeepAlive",
                "UpdateNetworkPolicy",
                "GetExecutorAccess",
                "GetSandbox",
            ):
                ids = st.one_of(st.just(world.foreign.id), st.text(max_size=30))
                _fuzz_method(
                    world,
                    tally,
                    world.gateway,
                    method,
                    st.just(bearer(world.key)),
                    ids,
                    must_refuse=True,
                )
            else:
                _fuzz_method(
                    world,
                    tally,
                    world.gateway,
                    method,
                    st.just(bearer(world.key)),
                    st.none(),
                    must_refuse=False,
                )
            _check_unchanged(world, before, foreign_before)
    tally.extra["failed_records_left"] = failed_rows(world.stack.home)
    data = tally.write()
    assert not tally.unclear, tally.unclear[:5]
    assert data["rpcs"] == len(SANDBOX_SERVICE.methods) + len(POOL_SERVICE.methods)


def test_executor_rpcs_with_random_fields(world: World) -> None:
    """ExecutorService: random fields with forged tokens, another tenant's token or id (all
    refused), and the victim's own token and id (clear answers; the victim may change)."""
    tally = Tally("clients-executor-fields")
    before, foreign_before = state_snapshot(world.stack.home), world.foreign_state()
    forged = st.one_of(
        _forged_keys(),
        st.just(bearer(world.foreign_token)),
        st.just(bearer(world.victim_token + "x")),
    )
    for method in EXECUTOR_SERVICE.methods:
        # Not the foreign id here: the foreign token with the foreign id is mallory's own, valid call.
        ids = st.one_of(st.just(world.victim.id), st.text(max_size=30))
        _fuzz_method(world, tally, world.executor, method, forged, ids, must_refuse=True)
        # The victim's token with the foreign sandbox's id: refused (tokens name one sandbox).
        _fuzz_method(
            world,
            tally,
            world.executor,
            method,
            st.just(bearer(world.victim_token)),
            st.just(world.foreign.id),
            must_refuse=True,
        )
        _fuzz_method(
            world,
            tally,
            world.executor,
            method,
            st.just(bearer(world.victim_token)),
            st.just(world.victim.id),
            must_refuse=False,
        )
        _check_unchanged(world, before, foreign_before)
    data = tally.write()
    assert not tally.unclear, tally.unclear[:5]
    assert data["rpcs"] == len(EXECUTOR_SERVICE.methods)


def _hostile_notices(world: World) -> st.SearchStrategy[tuple[str, str]]:
    """(sandbox id, notice) pairs no one holding only a tenant's key or token can turn into
    a revocation or a key drop: random text, oversized, the victim's notice signed with
    another key or mutated, the foreign sandbox's real notice sent under the victim's id,
    one dated ahead; key-drop notices (``d1``) the same ways, and one signed with the very
    key it drops."""
    ring = TokenSigner(NodeLayout(world.stack.home).keyring_file())
    stranger = TokenSigner.from_key(secrets.token_bytes(32))
    victim, foreign = world.victim.id, world.foreign.id
    now = time.time()
    forged = stranger.sign_revocation(victim, "dev", now)
    ahead = ring.sign_revocation(victim, "dev", now + 3600)
    foreign_real = ring.sign_revocation(foreign, "mallory", now)
    kid = ring.ring.ring().current
    drop_forged = stranger.sign_key_drop(victim, kid, created=now)
    foreign_drop = ring.sign_key_drop(foreign, "k1", created=now)
    self_signed = f"d1.{kid}.{victim}.{kid}"
    self_signed += "." + _mac(ring.sandbox_keys_for(victim)[kid], self_signed)

    def mutated(notice: str, at: int, char: str) -> str:
        at %= len(notice)
        return notice[:at] + char + notice[at + 1 :]

    notices = st.one_of(
        st.text(max_size=200),
        st.builds(lambda n: "r1." + "A" * n, st.integers(1000, 200_000)),
        st.just(forged),
        st.just(ahead),
        st.just(foreign_real),
        st.builds(mutated, st.just(foreign_real), st.integers(0, 10_000), st.characters()),
        st.just(world.victim_token),
        st.builds(lambda n: "d1." + "A" * n, st.integers(1000, 200_000)),
        st.just(drop_forged),
        st.just(foreign_drop),
        st.just(self_signed),
        st.builds(mutated, st.just(foreign_drop), st.integers(0, 10_000), st.characters()),
    )
    real = {(foreign, foreign_real), (foreign, foreign_drop)}  # only we could sign those
    return st.tuples(st.sampled_from([victim, victim, foreign, "sb-nope"]), notices).filter(
        lambda pair: pair not in real
    )


def test_revoke_refuses_hostile_notices(world: World) -> None:
    """ExecutorService.Revoke (a notice signed with the sandbox's own key voids its tenant's
    older tokens): every forged, random, oversized, future-dated or other sandbox's notice is
    refused with a clear status, and both tenants' tokens keep working."""
    tally = Tally("clients-revoke-notices")
    revoke = EXECUTOR_SERVICE.methods_by_name["Revoke"]

    @FUZZ
    @given(pair=_hostile_notices(world), metadata=_forged_keys())
    def one(pair: tuple[str, str], metadata: tuple[tuple[str, str], ...]) -> None:
        if not _ascii_metadata_ok(metadata):
            metadata = ()
        sandbox_id, notice = pair
        request = executor_pb2.RevokeRequest(sandbox_id=sandbox_id, notice=notice)
        outcome = call_raw(world.executor, revoke, [request.SerializeToString()], metadata)
        tally.add("Revoke", outcome, notice[:120])
        assert outcome.code in (
            grpc.StatusCode.UNAUTHENTICATED,
            grpc.StatusCode.INVALID_ARGUMENT,
            grpc.StatusCode.RESOURCE_EXHAUSTED,  # past the executor's message size
        ), (outcome, pair)

    before, foreign_before = state_snapshot(world.stack.home), world.foreign_state()
    one()
    _check_unchanged(world, before, foreign_before)  # the victim's token still runs commands
    data = tally.write()
    assert not tally.unclear, tally.unclear[:5]
    assert data["calls"] >= EXAMPLES


def test_reward_rpcs_refuse_forged_keys(world: World) -> None:
    """RewardService: random fields with no or forged API keys are refused before any work."""
    tally = Tally("clients-rewards-fields")
    before = state_snapshot(world.stack.home)
    for method in REWARD_SERVICE.methods:
        _fuzz_method(
            world, tally, world.rewards, method, _forged_keys(), st.none(), must_refuse=True
        )
        assert state_snapshot(world.stack.home) == before
        world.control()
    tally.write()
    assert not tally.unclear, tally.unclear[:5]


def _channel_for(
    world: World, service: ServiceDescriptor
) -> tuple[grpc.Channel, tuple[tuple[str, str], ...]]:
    if service is EXECUTOR_SERVICE:
        return world.executor, bearer(world.victim_token)
    if service is REWARD_SERVICE:
        return world.rewards, bearer("forged")
    return world.gateway, bearer(world.key)


def _fuzz_raw(
    tally: Tally,
    channel: grpc.Channel,
    method: MethodDescriptor,
    metadata: tuple[tuple[str, str], ...],
    others: list[Any],
) -> None:
    @FUZZ
    @given(payload=raw_messages(method.input_type, others))
    def one(payload: bytes) -> None:
        outcome = call_raw(channel, method, [payload], metadata)
        tally.add(method.name, outcome, payload.hex()[:100])

    one()


def test_raw_bytes_to_every_rpc(world: World) -> None:
    """Random, truncated, wire-broken (invalid UTF-8, 11-byte varints, lengths past the end,
    open groups) and type-confused bytes, sent with identity serializers."""
    tally = Tally("clients-raw-bytes")
    before, foreign_before = state_snapshot(world.stack.home), world.foreign_state()
    for service in ALL_SERVICES:
        channel, metadata = _channel_for(world, service)
        for method in service.methods:
            if method.name in ("CreateSandbox", "Hint"):
                metadata_here = bearer("forged")  # a confused message can be a valid create
            else:
                metadata_here = metadata
            others = [t for t in ALL_TYPES if t is not method.input_type]

            _fuzz_raw(tally, channel, method, metadata_here, others)
        _check_unchanged(world, before, foreign_before)
    data = tally.write()
    assert not tally.unclear, tally.unclear[:5]
    assert data["rpcs"] == sum(len(s.methods) for s in ALL_SERVICES)


def test_oversized_messages_are_refused(world: World) -> None:
    """One message past each server's receive limit: RESOURCE_EXHAUSTED, and serving goes on."""
    tally = Tally("clients-oversized")
    cases = [
        (world.gateway, SANDBOX_SERVICE.methods_by_name["GetSandbox"], 5 << 20),  # 4 MiB default
        (world.executor, EXECUTOR_SERVICE.methods_by_name["Run"], 65 << 20),  # 64 MiB
        (world.rewards, REWARD_SERVICE.methods_by_name["Judge"], 21 << 20),  # 20 MiB
    ]
    for channel, method, size in cases:
        payload = b"\x0a" + _varint(size - 6) + b"a" * (size - 6)
        outcome = call_raw(channel, method, [payload], bearer(world.key), timeout=60)
        tally.add(method.name, outcome, f"{size} bytes")
        assert outcome.code == grpc.StatusCode.RESOURCE_EXHAUSTED, outcome
        world.control()
    tally.write()
    assert not tally.unclear


def _varint(value: int) -> bytes:
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def test_a_million_tiny_chunks(world: World) -> None:
    """A WriteFile stream of 1-byte chunks (bounded: 200k chunks or 25 s). Past the first 64 the
    executor paces them (1000/s per stream) and refuses the stream at MAX_SMALL_MESSAGES
    with RESOURCE_EXHAUSTED; a neighbour's exec latency is measured meanwhile."""
    # The attacker is its own process, as a real client is: in this one it would share the GIL
    # with the latency probe and slow the probe itself.
    baseline = latencies(lambda: world.foreign.exec(["true"]), 20)
    attacker = start_attacker(world.executor_address, world.victim_token, world.victim.id, 25.0)
    start = time.monotonic()
    during: list[float] = []
    while attacker.poll() is None and len(during) < 200:
        during += latencies(lambda: world.foreign.exec(["true"]), 1)
        time.sleep(0.05)
    out, _ = attacker.communicate(timeout=150)
    elapsed = time.monotonic() - start
    report = json.loads(out)
    sent = report["sent"]
    outcome = Outcome(getattr(grpc.StatusCode, report["code"]), report["details"] or "")
    size = world.victim.exec("stat -c %s /tmp/tiny").stdout_text.strip()
    tally = Tally("clients-tiny-chunks")
    tally.add("WriteFile", outcome, f"{sent} chunks")
    tally.extra.update(
        chunks=sent,
        seconds=round(elapsed, 1),
        chunks_per_second=round(sent / elapsed),
        stored_bytes=size,
        neighbour_p50_ms_baseline=p50_ms(baseline),
        neighbour_p50_ms_during=p50_ms(during) if during else None,
        neighbour_samples_during=len(during),
    )
    tally.write()
    assert outcome.code == grpc.StatusCode.RESOURCE_EXHAUSTED and outcome.clear, outcome
    assert "larger chunks" in outcome.details
    world.control()


def test_idle_streams_and_idle_connections(world: World) -> None:
    """100 WriteFile streams opened and left idle, 200 TCP connections to the gateway and the
    executor opened and left: others are served throughout; fds and memory stay bounded and
    return when the clients go."""
    executor_pid = service_pid(world.stack.process.pid, "orchard.executor")
    gateway_pid = service_pid(world.stack.process.pid, "orchard.gateway")
    fds_before = (fd_count(executor_pid), fd_count(gateway_pid))
    rss_before = rss_kib(executor_pid)
    method = EXECUTOR_SERVICE.methods_by_name["WriteFile"]
    header = executor_pb2.WriteFileRequest(
        header=executor_pb2.WriteFileHeader(
            sandbox_id=world.victim.id, path="/tmp/idle", mode=0o644
        )
    ).SerializeToString()
    release = threading.Event()

    end = executor_pb2.WriteFileRequest(end=executor_pb2.WriteFileEnd(size=0)).SerializeToString()

    def idle_requests() -> Iterator[bytes]:
        yield header
        release.wait(60)
        yield end  # released: the (empty) file is complete

    futures = [
        world.executor.stream_unary(f"/{method.containing_service.full_name}/{method.name}").future(
            idle_requests(), metadata=bearer(world.victim_token), timeout=90
        )
        for _ in range(100)
    ]
    sockets: list[socket.socket] = []
    for address in (world.stack.endpoint, world.executor_target()):
        host, port = address.rsplit(":", 1)
        for _ in range(100):
            sockets.append(socket.create_connection((host, int(port)), timeout=5))
    try:
        time.sleep(1.0)
        held = latencies(world.control, 10)
        fds_held = (fd_count(executor_pid), fd_count(gateway_pid))
        rss_held = rss_kib(executor_pid)
        time.sleep(5.0)
        world.control()
    finally:
        release.set()
        for s in sockets:
            s.close()
    outcomes = []
    for future in futures:
        try:
            future.result(timeout=60)
            outcomes.append(Outcome(grpc.StatusCode.OK, ""))
        except grpc.RpcError as err:
            outcomes.append(Outcome(err.code(), err.details() or ""))  # type: ignore[attr-defined]
    time.sleep(2.0)
    fds_after = (fd_count(executor_pid), fd_count(gateway_pid))
    tally = Tally("clients-idle")
    for outcome in outcomes:
        tally.add("WriteFile(idle)", outcome)
    tally.extra.update(
        idle_streams=len(futures),
        idle_connections=len(sockets),
        control_p50_ms_while_held=p50_ms(held),
        executor_fds=[fds_before[0], fds_held[0], fds_after[0]],
        gateway_fds=[fds_before[1], fds_held[1], fds_after[1]],
        executor_rss_kib=[rss_before, rss_held],
    )
    tally.write()
    assert not tally.unclear, tally.unclear[:3]
    assert fds_after[0] <= fds_before[0] + 20 and fds_after[1] <= fds_before[1] + 20
    assert rss_held - rss_before < 64 * 1024  # 100 idle streams cost less than 64 MiB
