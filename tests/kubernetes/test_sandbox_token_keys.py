"""Attacks on the data-plane token keys of Kubernetes sandboxes (issue 12, class 6).

A Kubernetes API server cannot run on these machines, so the API server is the
FAKE one the other tests here use (``fake_apiserver.py``); everything else is
real: the scheduler (gRPC, SQLite store), the ``kubernetes`` client, the backend,
and, for the revocation attacks, the executor a sandbox pod runs, started the way
the pod's init container and command start it (its run folder holding the
``token.key`` its pod mounts, ``--in-sandbox``), listening at the pod IP the fake
kubelet gave the pod.

Before: every sandbox pod mounted the deployment's node token key (the Secret
``orchard-executor-token``), so tenant code that read it out of one pod (the
executor runs as the same user as the task) could mint a token for any other
tenant's sandbox; and a revoked tenant's tokens kept working in its pods until
they expired (``revocations.json`` is a node file no pod shares).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from orchard.executor.in_sandbox import TOKEN_KEY_FILE, take_token_key
from orchard.executor.server import start_server, token_verifier
from orchard.executor.settings import ExecutorSettings
from orchard.gateway.tenants import TenantRegistry
from orchard.scheduler.backends.kubernetes import KubernetesBackend
from orchard.scheduler.backends.kubernetes import manifests as m
from orchard.scheduler.settings import SchedulerSettings

from orchard._proto.orchard.v1 import executor_pb2, executor_pb2_grpc, sandbox_pb2
from orchard.common.layout import NodeLayout
from orchard.common.service_runner import ServiceRunner
from orchard.common.tokens import (
    Keyring,
    KeyringFile,
    TokenError,
    TokenSigner,
    TokenVerifier,
    decode_sandbox_keys,
)
from tests.scheduler.conftest import ControlPlane, start_control_plane

from .conftest import NAMESPACE, fake_settings
from .fake_apiserver import FakeApiServer
from .test_scheduler_on_kubernetes import wait_for

pytestmark = pytest.mark.reliability

REVOKED_WITHIN_SECONDS = 5.0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def port() -> int:
    return _free_port()


@pytest.fixture
def plane(tmp_path: Path, fake_api: FakeApiServer, port: int) -> Iterator[ControlPlane]:
    backend = KubernetesBackend(
        fake_settings(
            fake_api,
            executor_port=port,
            revocations_file=NodeLayout(tmp_path).revocations,
            revocation_check_seconds=0.2,
        ),
        keyring=NodeLayout(tmp_path).keyring_file(),  # the scheduler's own (same home)
    )
    cp = start_control_plane(
        tmp_path, backend, lambda home: SchedulerSettings(home=home, executor_address="")
    )
    try:
        yield cp
    finally:
        cp.stop()
        cp.loop.run(backend.close())
        cp.loop.close()


def create(plane: ControlPlane, tenant: str) -> sandbox_pb2.Sandbox:
    made = plane.stub.CreateSandbox(
        sandbox_pb2.CreateSandboxRequest(ttl_seconds=300), metadata=plane.auth(tenant)
    )
    assert made.state == sandbox_pb2.READY
    return made


def mounted_material(fake_api: FakeApiServer, sandbox_id: str) -> list[bytes]:
    """Every secret byte string the pod of ``sandbox_id`` gets: its Secret volumes' items
    and its containers' env values (what tenant code in the pod could read)."""
    pod = fake_api.pod(NAMESPACE, sandbox_id)
    assert pod is not None
    secrets = {s["metadata"]["name"]: s for s in fake_api.objects("secrets", NAMESPACE)}
    found: list[bytes] = []
    for volume in pod["spec"].get("volumes") or []:
        name = (volume.get("secret") or {}).get("secretName")
        if name is None:
            continue
        assert name in secrets, f"pod {sandbox_id} mounts Secret {name}, which does not exist"
        found += [base64.b64decode(v) for v in (secrets[name].get("data") or {}).values()]
    for container in [*pod["spec"].get("initContainers", []), *pod["spec"]["containers"]]:
        found += [str(e.get("value", "")).encode() for e in container.get("env") or []]
    return found


def pod_token_key(fake_api: FakeApiServer, sandbox_id: str) -> bytes:
    """What the pod's init container copies to ``run/token.key``."""
    pod = fake_api.pod(NAMESPACE, sandbox_id)
    assert pod is not None
    volume = next(v for v in pod["spec"]["volumes"] if v["name"] == m.TOKEN_VOLUME)
    secret = next(
        s
        for s in fake_api.objects("secrets", NAMESPACE)
        if s["metadata"]["name"] == volume["secret"]["secretName"]
    )
    return base64.b64decode(secret["data"][m.TOKEN_KEY_FILE])


def forged_tokens(material: bytes, victim: str, tenant: str, kids: set[str]) -> list[str]:
    """The strongest tokens for ``victim`` an attacker holding ``material`` can make: with
    it as a node key under every key id it may be, and with every key it holds."""
    keys: list[tuple[str, bytes]] = []
    try:
        _own_id, own = decode_sandbox_keys(material)
        keys += list(own.items())
        keys += [(kid, key) for key in own.values() for kid in kids]
    except TokenError:
        pass
    if len(material) >= 32:
        keys += [(kid, material) for kid in kids]
    tokens = []
    for kid, key in keys:
        # As a node key: derive the victim's key from it, as the scheduler would.
        tokens.append(TokenSigner(Keyring({kid: key}, kid)).issue(victim, 300, tenant=tenant)[0])
        # As a sandbox key: sign the victim's token with it directly.
        tokens.append(_sign_directly(key, kid, victim, tenant))
    return tokens


def _sign_directly(key: bytes, kid: str, sandbox_id: str, tenant: str) -> str:
    tenant_b64 = base64.urlsafe_b64encode(tenant.encode()).rstrip(b"=").decode()
    payload = (
        f"v3.{kid}.{sandbox_id}.{tenant_b64}.0.{int(time.time() * 1000)}.{int(time.time()) + 300}"
    )
    sig = hmac.new(key, payload.encode(), hashlib.sha256).digest()
    return payload + "." + base64.urlsafe_b64encode(sig).rstrip(b"=").decode()


def pod_verifier(fake_api: FakeApiServer, sandbox_id: str, tmp: Path) -> TokenVerifier:
    """The verifier the pod's executor builds from what its pod mounts."""
    run = tmp / f"run-{sandbox_id}"
    run.mkdir()
    (run / TOKEN_KEY_FILE).write_bytes(pod_token_key(fake_api, sandbox_id))
    return token_verifier(
        ExecutorSettings(
            home=run, in_sandbox_run_dir=run, token_key=take_token_key(run / TOKEN_KEY_FILE)
        )
    )


def test_a_key_read_out_of_one_pod_mints_no_token_for_another_sandbox(
    plane: ControlPlane, fake_api: FakeApiServer, tmp_path: Path
) -> None:
    mine = create(plane, "mallory")
    victim = create(plane, "alice")
    node = NodeLayout(tmp_path).keyring_file().ring()
    kids = {mine.executor.token.split(".")[1], victim.executor.token.split(".")[1], "k0"}
    material = mounted_material(fake_api, mine.id)
    assert material, "the pod gets its token key somehow"
    for blob in material:
        for node_key in node.keys.values():
            assert node_key not in blob and node_key.hex().encode() not in blob
    victim_pod = pod_verifier(fake_api, victim.id, tmp_path)
    node_verifier = TokenVerifier(keyring=NodeLayout(tmp_path).keyring_file())
    forged = [t for blob in material for t in forged_tokens(blob, victim.id, "alice", kids)]
    assert forged
    for token in forged:
        for verifier in (victim_pod, node_verifier):
            with pytest.raises(TokenError):
                verifier.verify(token, victim.id)
    # Each pod's own key still verifies the tokens the scheduler issues for it.
    assert victim_pod.verify(victim.executor.token, victim.id).tenant == "alice"
    mine_pod = pod_verifier(fake_api, mine.id, tmp_path)
    assert mine_pod.verify(mine.executor.token, mine.id).tenant == "mallory"
    with pytest.raises(TokenError):  # a pod serves its own sandbox only
        mine_pod.verify(victim.executor.token, victim.id)


def test_each_pod_has_its_own_token_secret_which_goes_with_it(
    plane: ControlPlane, fake_api: FakeApiServer
) -> None:
    made = create(plane, "alice")
    pod = fake_api.pod(NAMESPACE, made.id)
    assert pod is not None
    secret = next(
        s
        for s in fake_api.objects("secrets", NAMESPACE)
        if s["metadata"]["name"] == m.token_secret_name(made.id)
    )
    owners = secret["metadata"].get("ownerReferences") or []
    assert [(o["kind"], o["name"], o["uid"]) for o in owners] == [
        ("Pod", made.id, pod["metadata"]["uid"])
    ]
    # Only the init container mounts it (the executor removes its copy before any command).
    task = pod["spec"]["containers"][0]
    assert all(v["name"] != m.TOKEN_VOLUME for v in task["volumeMounts"])
    plane.stub.DeleteSandbox(sandbox_pb2.DeleteSandboxRequest(id=made.id), metadata=plane.auth())
    wait_for(
        "the pod and its Secret to go",
        lambda: (
            fake_api.pod(NAMESPACE, made.id) is None
            and not [
                s
                for s in fake_api.objects("secrets", NAMESPACE)
                if s["metadata"]["name"] == m.token_secret_name(made.id)
            ]
        ),
    )


# ---- revocation -----------------------------------------------------------------------


class PodExecutors:
    """The executors the sandbox pods run (started as the pod starts them), one per pod."""

    def __init__(self, plane: ControlPlane, fake_api: FakeApiServer, port: int, tmp: Path):
        self.plane, self.fake_api, self.port, self.tmp = plane, fake_api, port, tmp
        self.runners: list[ServiceRunner] = []

    def start(self, sandbox_id: str) -> str:
        pod = self.fake_api.pod(NAMESPACE, sandbox_id)
        assert pod is not None
        run = self.tmp / f"pod-{sandbox_id}"
        run.mkdir()
        (run / TOKEN_KEY_FILE).write_bytes(pod_token_key(self.fake_api, sandbox_id))
        env = pod["spec"]["initContainers"][0]["env"]
        (run / "sandbox.json").write_text(next(e["value"] for e in env))
        # orchard-init binds this in a pod; the calls here (Stat, Revoke) never use it.
        (run / "init.sock").touch()
        address = f"{pod['status']['podIP']}:{self.port}"
        settings = ExecutorSettings(
            home=run,
            listen=address,
            in_sandbox_run_dir=run,
            token_key=take_token_key(run / TOKEN_KEY_FILE),
        )
        runner, _servicer = self.plane.loop.run(start_server(settings))
        self.runners.append(runner)
        return address

    def stop(self) -> None:
        for runner in self.runners:
            self.plane.loop.run(runner.stop(0))


@pytest.fixture
def pods(
    plane: ControlPlane, fake_api: FakeApiServer, port: int, tmp_path: Path
) -> Iterator[PodExecutors]:
    executors = PodExecutors(plane, fake_api, port, tmp_path)
    try:
        yield executors
    finally:
        executors.stop()


def stat(address: str, sandbox_id: str, token: str) -> grpc.StatusCode:
    with grpc.insecure_channel(address) as channel:
        stub = executor_pb2_grpc.ExecutorServiceStub(channel)
        try:
            stub.Stat(
                executor_pb2.StatRequest(sandbox_id=sandbox_id, path="/"),
                metadata=(("authorization", f"Bearer {token}"),),
                timeout=5,
            )
        except grpc.RpcError as err:
            return err.code()  # type: ignore[no-any-return]
    return grpc.StatusCode.OK


def until_refused(address: str, sandbox_id: str, token: str) -> float:
    started = time.monotonic()
    while time.monotonic() - started < REVOKED_WITHIN_SECONDS:
        if stat(address, sandbox_id, token) == grpc.StatusCode.UNAUTHENTICATED:
            return time.monotonic() - started
        time.sleep(0.05)
    raise AssertionError(f"still accepted {REVOKED_WITHIN_SECONDS} s after the revocation")


@pytest.mark.parametrize("how", ["revoke", "rotate-key"])
def test_a_revoked_tenants_tokens_stop_working_in_its_pods_within_seconds(
    plane: ControlPlane, fake_api: FakeApiServer, pods: PodExecutors, tmp_path: Path, how: str
) -> None:
    tenants = TenantRegistry(tmp_path)
    tenants.create("alice")
    tenants.create("bob")
    victim, bystander = create(plane, "alice"), create(plane, "bob")
    victim_at, bystander_at = pods.start(victim.id), pods.start(bystander.id)
    assert stat(victim_at, victim.id, victim.executor.token) == grpc.StatusCode.OK
    assert stat(bystander_at, bystander.id, bystander.executor.token) == grpc.StatusCode.OK
    time.sleep(0.01)  # the revocation comes strictly after the tokens were issued
    if how == "revoke":
        tenants.revoke("alice")
    else:
        tenants.rotate_key("alice")
    until_refused(victim_at, victim.id, victim.executor.token)
    assert stat(bystander_at, bystander.id, bystander.executor.token) == grpc.StatusCode.OK
    if how == "rotate-key":
        # The new key's fresh tokens work (what the gateway fetches for the new key).
        fresh = plane.stub.GetExecutorAccess(
            sandbox_pb2.GetSandboxRequest(id=victim.id), metadata=plane.auth("alice")
        )
        assert stat(victim_at, victim.id, fresh.token) == grpc.StatusCode.OK


def test_a_pod_that_starts_listening_late_still_gets_the_revocation(
    plane: ControlPlane, fake_api: FakeApiServer, pods: PodExecutors, tmp_path: Path
) -> None:
    tenants = TenantRegistry(tmp_path)
    tenants.create("alice")
    victim = create(plane, "alice")
    time.sleep(0.01)
    tenants.revoke("alice")
    time.sleep(1.0)  # the scheduler's pushes fail: nothing listens at the pod IP yet
    address = pods.start(victim.id)
    until_refused(address, victim.id, victim.executor.token)


def test_a_dropped_keys_tokens_stop_working_in_its_pods(
    plane: ControlPlane, fake_api: FakeApiServer, pods: PodExecutors, tmp_path: Path
) -> None:
    """``orchard token-key rotate --drop`` on the scheduler's keyring: a pod holding the
    dropped key (its Secret got every key at creation) is sent a key-drop notice signed
    with another key it holds, and refuses the dropped key's token; before, it took it until
    it expired. A fresh token (a live key) works."""
    TenantRegistry(tmp_path).create("alice")
    ring = KeyringFile(NodeLayout(tmp_path).token_keyring)
    newer = ring.rotate()
    time.sleep(1.2)  # the scheduler re-reads the keyring at most once a second
    victim = create(plane, "alice")
    assert victim.executor.token.split(".")[1] == newer
    address = pods.start(victim.id)
    assert stat(address, victim.id, victim.executor.token) == grpc.StatusCode.OK
    ring.rotate(drop=(newer,))
    until_refused(address, victim.id, victim.executor.token)
    time.sleep(1.2)  # the scheduler's issuing signer sees the drop within a second too
    fresh = plane.stub.GetExecutorAccess(
        sandbox_pb2.GetSandboxRequest(id=victim.id), metadata=plane.auth("alice")
    )
    assert fresh.token.split(".")[1] != newer
    assert stat(address, victim.id, fresh.token) == grpc.StatusCode.OK


def test_a_revocation_notice_works_only_for_its_own_sandbox(
    plane: ControlPlane, fake_api: FakeApiServer, pods: PodExecutors, tmp_path: Path
) -> None:
    """The notice is the only credential of Revoke: one signed for another sandbox, with
    another sandbox's key, forged, or dated far ahead is refused, and the tokens stay."""
    mine, victim = create(plane, "mallory"), create(plane, "alice")
    address = pods.start(victim.id)
    signer = TokenSigner(NodeLayout(tmp_path).keyring_file())
    own_keys = decode_sandbox_keys(pod_token_key(fake_api, mine.id))[1]
    kid, own_key = next(iter(own_keys.items()))
    # What the attacker can sign: notices with its own sandbox's key, naming the victim.
    with_own_key = TokenSigner.from_key(b"x" * 32)
    forged_sig = _sign_notice(own_key, kid, victim.id, "alice", time.time())
    bad = [
        signer.sign_revocation(mine.id, "alice", time.time()),  # for another sandbox
        forged_sig,
        with_own_key.sign_revocation(victim.id, "alice", time.time()),
        signer.sign_revocation(victim.id, "alice", time.time() + 3600),  # far ahead
        "r1.garbage",
    ]
    with grpc.insecure_channel(address) as channel:
        stub = executor_pb2_grpc.ExecutorServiceStub(channel)
        for notice in bad:
            with pytest.raises(grpc.RpcError) as err:
                stub.Revoke(
                    executor_pb2.RevokeRequest(sandbox_id=victim.id, notice=notice), timeout=5
                )
            assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED, notice
            assert "revocation notice refused" in (err.value.details() or ""), notice
    assert stat(address, victim.id, victim.executor.token) == grpc.StatusCode.OK


def _sign_notice(key: bytes, kid: str, sandbox_id: str, tenant: str, before: float) -> str:
    tenant_b64 = base64.urlsafe_b64encode(tenant.encode()).rstrip(b"=").decode()
    payload = f"r1.{kid}.{sandbox_id}.{tenant_b64}.{int(before * 1000)}"
    sig = hmac.new(key, payload.encode(), hashlib.sha256).digest()
    return payload + "." + base64.urlsafe_b64encode(sig).rstrip(b"=").decode()


def test_a_node_key_handed_to_a_pod_executor_is_refused(tmp_path: Path) -> None:
    """Defence in depth: an injected executor given a raw key (the old chart's) won't start."""
    run = tmp_path / "run"
    run.mkdir()
    with pytest.raises(TokenError, match="never takes a node key"):
        token_verifier(ExecutorSettings(home=run, in_sandbox_run_dir=run, token_key=b"k" * 32))
