"""The scheduler driving the Kubernetes backend, against the FAKE API server.

There is no cluster on these machines, so the API server is the test's fake
(``fake_apiserver.py``: real HTTP on loopback, label selectors, watches,
resourceVersion conflicts, a tiny kubelet). Everything else is real: the
scheduler (gRPC server on a free port, SQLite store, pool filler, reaper), the
``kubernetes`` client and the backend. Calls go to the scheduler with the
``orchard-tenant`` metadata the gateway sets.
"""

from __future__ import annotations

import json
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from orchard.scheduler.backends.kubernetes import KubernetesBackend
from orchard.scheduler.backends.kubernetes import manifests as m
from orchard.scheduler.backends.netpolicy.k8s import PROXY_CONFIGMAP
from orchard.scheduler.settings import PoolSettings, SchedulerSettings

from orchard._proto.orchard.v1 import common_pb2, pools_pb2, sandbox_pb2
from orchard.common.layout import NodeLayout
from tests.scheduler.conftest import ControlPlane, start_control_plane

from .conftest import NAMESPACE, fake_settings
from .fake_apiserver import FakeApiServer
from .schemas import KUBERNETES_VERSIONS, schema_errors

CONTROL_NAMESPACE = "orchard"
TEMPLATES = """
[templates.py]
cpu_millis = 250
memory_bytes = 268435456
min = 2
max = 4

[templates.web]
network = "allowlist"
cidrs = ["203.0.113.0/24"]
ports = [443]
domains = ["pypi.org"]
min = 1
max = 2
"""
Mode = common_pb2.NetworkPolicy.Mode


def wait_for(what: str, check: Callable[[], Any], timeout: float = 10.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = check()
        if found:
            return found
        time.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.fixture
def plane(tmp_path: Path, fake_api: FakeApiServer) -> Iterator[ControlPlane]:
    (tmp_path / "templates.toml").write_text(TEMPLATES)
    backend = KubernetesBackend(
        fake_settings(fake_api, control_namespace=CONTROL_NAMESPACE),
        keyring=NodeLayout(tmp_path).keyring_file(),  # the scheduler's own (same home)
    )

    def settings(home: Path) -> SchedulerSettings:
        # No node executor on Kubernetes: every address must come from a pod.
        return SchedulerSettings(
            home=home,
            executor_address="",
            reap_interval_seconds=0.1,
            pools=PoolSettings(tick_seconds=0.05, refill_quiet_seconds=0.0),
        )

    cp = start_control_plane(tmp_path, backend, settings)
    try:
        yield cp
    finally:
        cp.stop()
        cp.loop.run(backend.close())
        cp.loop.close()


def wait_pool_ready(plane: ControlPlane, template: str, count: int) -> None:
    """Until the scheduler counts ``count`` READY members (pods Ready and recorded)."""

    def ready() -> bool:
        pools = plane.pools.ListPools(pools_pb2.ListPoolsRequest(), metadata=plane.auth()).pools
        return any(p.template.name == template and p.ready >= count for p in pools)

    wait_for(f"{count} ready {template} members", ready)


def pod_address(fake_api: FakeApiServer, sandbox_id: str) -> str:
    pod = fake_api.pod(NAMESPACE, sandbox_id)
    assert pod is not None
    return f"{pod['status']['podIP']}:7070"


def free_members(fake_api: FakeApiServer, pool: str) -> list[str]:
    return sorted(
        p["metadata"]["name"]
        for p in fake_api.pods(NAMESPACE)
        if p["metadata"]["labels"].get(m.POOL) == pool
        and p["metadata"]["labels"].get(m.CLAIM) == m.CLAIM_FREE
        and (p.get("status") or {}).get("podIP")
    )


def proxy_table(fake_api: FakeApiServer) -> dict[str, Any]:
    maps = [
        c
        for c in fake_api.objects("configmaps", CONTROL_NAMESPACE)
        if c["metadata"]["name"] == PROXY_CONFIGMAP
    ]
    if not maps:
        return {}
    return {k: json.loads(v) for k, v in (maps[0].get("data") or {}).items()}


def egress_policies(fake_api: FakeApiServer) -> dict[str, dict[str, Any]]:
    return {
        p["metadata"]["name"]: p
        for p in fake_api.objects("networkpolicies", NAMESPACE)
        if p["metadata"]["name"].endswith("-egress")
    }


def test_create_answers_with_the_pod_ip_not_a_node_executor(
    plane: ControlPlane, fake_api: FakeApiServer
) -> None:
    made = plane.stub.CreateSandbox(
        sandbox_pb2.CreateSandboxRequest(ttl_seconds=300), metadata=plane.auth()
    )
    assert made.state == sandbox_pb2.READY
    assert made.executor.address == pod_address(fake_api, made.id)
    assert made.executor.token
    access = plane.stub.GetExecutorAccess(
        sandbox_pb2.GetSandboxRequest(id=made.id), metadata=plane.auth()
    )
    assert access.address == made.executor.address
    pod = fake_api.pod(NAMESPACE, made.id)
    assert pod is not None
    assert pod["metadata"]["annotations"][m.A_TENANT] == "alice"
    # The owner's TTL is on the pod: the kubelet ends it even without a scheduler.
    assert pod["spec"]["activeDeadlineSeconds"] == 300 + 300
    plane.stub.DeleteSandbox(sandbox_pb2.DeleteSandboxRequest(id=made.id), metadata=plane.auth())
    # The delete answers at DELETING; the backend's delete follows in the background.
    wait_for("the pod to be deleted", lambda: fake_api.pod(NAMESPACE, made.id) is None)


def test_pool_members_are_free_pods_and_a_claim_takes_one_by_its_resource_version(
    plane: ControlPlane, fake_api: FakeApiServer
) -> None:
    wait_pool_ready(plane, "py", 2)
    before = free_members(fake_api, "py")
    claimed = plane.stub.CreateSandbox(
        sandbox_pb2.CreateSandboxRequest(template="py", labels={"run": "7"}, ttl_seconds=120),
        metadata=plane.auth("bob"),
    )
    assert claimed.state == sandbox_pb2.CLAIMED
    assert claimed.id in before, "a claim with no env adopts a warm pod"
    assert claimed.executor.address == pod_address(fake_api, claimed.id)
    pod = fake_api.pod(NAMESPACE, claimed.id)
    assert pod is not None
    labels, annotations = pod["metadata"]["labels"], pod["metadata"]["annotations"]
    assert (labels[m.CLAIM], labels[m.TENANT]) == (m.CLAIMED, "bob")
    assert json.loads(annotations[m.A_LABELS]) == {"run": "7"}
    # The deadline came down from the unclaimed lifetime to about ttl + grace.
    assert pod["spec"]["activeDeadlineSeconds"] <= 120 + 300 + 5
    # The conditional patch carried the resourceVersion the claimer saw.
    assert ("PATCH", f"/api/v1/namespaces/{NAMESPACE}/pods/{claimed.id}") in fake_api.requests
    # The pool refills with another free pod.
    wait_for("the pool refilled", lambda: len(free_members(fake_api, "py")) >= 2 or None)


def test_a_pod_another_replica_claimed_is_never_handed_out(
    plane: ControlPlane, fake_api: FakeApiServer
) -> None:
    wait_pool_ready(plane, "py", 2)
    pools = plane.pools.ListPools(pools_pb2.ListPoolsRequest(), metadata=plane.auth())
    assert {p.template.name for p in pools.pools} == {"py", "web"}
    # Another scheduler replica claims every free pod straight on the API server.
    taken = free_members(fake_api, "py")
    for name in taken:
        patch = {"metadata": {"labels": {m.CLAIM: m.CLAIMED, m.TENANT: "other"}}}
        request = urllib.request.Request(
            f"{fake_api.url}/api/v1/namespaces/{NAMESPACE}/pods/{name}",
            data=json.dumps(patch).encode(),
            method="PATCH",
            headers={"Content-Type": "application/merge-patch+json"},
        )
        with urllib.request.urlopen(request, timeout=5) as answer:
            assert answer.status == 200
    claimed = plane.stub.CreateSandbox(
        sandbox_pb2.CreateSandboxRequest(template="py"), metadata=plane.auth("bob")
    )
    assert claimed.id not in taken
    pod = fake_api.pod(NAMESPACE, claimed.id)
    assert pod is not None and pod["metadata"]["labels"][m.TENANT] == "bob"
    for name in taken:  # still the other replica's, untouched
        other = fake_api.pod(NAMESPACE, name)
        assert other is not None and other["metadata"]["labels"][m.TENANT] == "other"


def test_a_claim_with_env_is_served_cold_on_kubernetes(
    plane: ControlPlane, fake_api: FakeApiServer
) -> None:
    wait_pool_ready(plane, "py", 2)
    before = set(free_members(fake_api, "py"))
    claimed = plane.stub.CreateSandbox(
        sandbox_pb2.CreateSandboxRequest(template="py", env={"SEED": "42"}),
        metadata=plane.auth(),
    )
    # A running pod's env cannot change, so the claim made a new pod with it.
    assert claimed.id not in before
    pod = fake_api.pod(NAMESPACE, claimed.id)
    assert pod is not None
    env = {e["name"]: e["value"] for e in pod["spec"]["containers"][0]["env"]}
    assert env["SEED"] == "42"
    (py,) = [
        p
        for p in plane.pools.ListPools(pools_pb2.ListPoolsRequest(), metadata=plane.auth()).pools
        if p.template.name == "py"
    ]
    assert (py.hits, py.misses) == (0, 1)


@pytest.mark.parametrize(
    ("status", "reason"),
    [
        (
            {
                "phase": "Failed",
                "conditions": [
                    {
                        "type": "DisruptionTarget",
                        "status": "True",
                        "reason": "PreemptionByScheduler",
                    }
                ],
            },
            "PREEMPTED",
        ),
        ({"phase": "Failed", "reason": "Evicted", "message": "node low on memory"}, "PREEMPTED"),
    ],
)
def test_preemption_and_eviction_make_the_sandbox_failed_with_fault_infrastructure(
    plane: ControlPlane, fake_api: FakeApiServer, status: dict[str, Any], reason: str
) -> None:
    made = plane.stub.CreateSandbox(sandbox_pb2.CreateSandboxRequest(), metadata=plane.auth())
    fake_api.set_status(NAMESPACE, made.id, status)

    def failed() -> sandbox_pb2.Sandbox | None:
        got = plane.stub.GetSandbox(
            sandbox_pb2.GetSandboxRequest(id=made.id), metadata=plane.auth()
        )
        return got if got.state == sandbox_pb2.FAILED else None

    got = wait_for("the sandbox to be FAILED", failed)
    assert got.fault == "infrastructure"
    assert got.state_reason
    record = plane.loop.call(lambda: plane.scheduler.store.get(made.id))
    assert record is not None and record.error_reason == reason
    with pytest.raises(grpc.RpcError) as err:
        plane.stub.GetExecutorAccess(
            sandbox_pb2.GetSandboxRequest(id=made.id), metadata=plane.auth()
        )
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION


def test_a_preempted_pool_member_leaves_the_pool(
    plane: ControlPlane, fake_api: FakeApiServer
) -> None:
    wait_pool_ready(plane, "py", 2)
    members = free_members(fake_api, "py")
    victim = members[0]
    fake_api.set_status(
        NAMESPACE,
        victim,
        {
            "conditions": [
                {"type": "DisruptionTarget", "status": "True", "reason": "PreemptionByScheduler"}
            ]
        },
    )
    wait_for("the preempted member to be removed", lambda: fake_api.pod(NAMESPACE, victim) is None)

    def state() -> str | None:
        record = plane.loop.call(lambda: plane.scheduler.store.get(victim))
        return None if record is None else record.state.name

    # The pod goes first; the record reaches DELETED once the rest of the teardown (its
    # token Secret, its policies) is done, a moment later under load.
    wait_for("the preempted member's record to be DELETED", lambda: state() == "DELETED", 30)
    assert state() == "DELETED"


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_allowlist_policy_follows_the_pod_through_updates_and_delete(
    plane: ControlPlane, fake_api: FakeApiServer, version: str
) -> None:
    network = common_pb2.NetworkPolicy(
        mode=Mode.ALLOWLIST, cidrs=["198.51.100.0/24"], ports=[443], domains=["pypi.org"]
    )
    made = plane.stub.CreateSandbox(
        sandbox_pb2.CreateSandboxRequest(network=network), metadata=plane.auth()
    )
    assert made.network.mode == Mode.ALLOWLIST
    name = f"orchard-sandbox-{made.id}-egress"
    policy = egress_policies(fake_api)[name]
    assert schema_errors(policy, version) == []
    (rule,) = policy["spec"]["egress"]
    assert [peer["ipBlock"]["cidr"] for peer in rule["to"]] == ["198.51.100.0/24"]
    pod = fake_api.pod(NAMESPACE, made.id)
    assert pod is not None
    assert pod["metadata"]["labels"][m.NETWORK] == "allowlist"
    env = {e["name"]: e["value"] for e in pod["spec"]["containers"][0]["env"]}
    assert env["HTTPS_PROXY"] == f"http://orchard-egress-proxy.{CONTROL_NAMESPACE}.svc:3128"
    entry = proxy_table(fake_api)[f"{made.id}.json"]
    assert entry["address"] == pod["status"]["podIP"]
    assert entry["policy"]["domains"] == ["pypi.org"]
    # The proxy's per-tenant caps count the pod under its tenant.
    assert entry["tenant"] and entry["tenant"] == pod["metadata"]["annotations"][m.A_TENANT]

    # allowlist -> internet: no per-sandbox rules, the class label moves, the proxy entry follows.
    plane.stub.UpdateNetworkPolicy(
        sandbox_pb2.UpdateNetworkPolicyRequest(
            id=made.id, network=common_pb2.NetworkPolicy(mode=Mode.INTERNET)
        ),
        metadata=plane.auth(),
    )
    assert name not in egress_policies(fake_api)
    pod = fake_api.pod(NAMESPACE, made.id)
    assert pod is not None and pod["metadata"]["labels"][m.NETWORK] == "internet"
    assert proxy_table(fake_api)[f"{made.id}.json"]["policy"]["mode"] == "internet"
    got = plane.stub.GetSandbox(sandbox_pb2.GetSandboxRequest(id=made.id), metadata=plane.auth())
    assert got.network.mode == Mode.INTERNET

    # -> none: nothing of the sandbox is left in the proxy's table.
    plane.stub.UpdateNetworkPolicy(
        sandbox_pb2.UpdateNetworkPolicyRequest(
            id=made.id, network=common_pb2.NetworkPolicy(mode=Mode.NONE)
        ),
        metadata=plane.auth(),
    )
    assert f"{made.id}.json" not in proxy_table(fake_api)

    plane.stub.UpdateNetworkPolicy(
        sandbox_pb2.UpdateNetworkPolicyRequest(id=made.id, network=network),
        metadata=plane.auth(),
    )
    assert name in egress_policies(fake_api)
    plane.stub.DeleteSandbox(sandbox_pb2.DeleteSandboxRequest(id=made.id), metadata=plane.auth())
    # The delete answers at DELETING; the backend's delete follows in the background.
    wait_for(
        "the pod and its egress policy to be deleted",
        lambda: (
            fake_api.pod(NAMESPACE, made.id) is None
            and name not in egress_policies(fake_api)
            and f"{made.id}.json" not in proxy_table(fake_api)
        ),
    )
    assert name not in egress_policies(fake_api)
    assert f"{made.id}.json" not in proxy_table(fake_api)


def test_an_allowlist_inside_the_cluster_is_refused_before_any_pod(
    tmp_path: Path, fake_api: FakeApiServer
) -> None:
    backend = KubernetesBackend(
        fake_settings(fake_api, cluster_cidrs=("10.244.0.0/16", "10.96.0.0/12")),
        keyring=NodeLayout(tmp_path).keyring_file(),
    )

    def settings(home: Path) -> SchedulerSettings:
        return SchedulerSettings(home=home, executor_address="")

    cp = start_control_plane(tmp_path, backend, settings)
    try:
        network = common_pb2.NetworkPolicy(mode=Mode.ALLOWLIST, cidrs=["10.244.3.0/24"])
        with pytest.raises(grpc.RpcError) as err:
            cp.stub.CreateSandbox(
                sandbox_pb2.CreateSandboxRequest(network=network), metadata=cp.auth()
            )
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "cluster's own ranges" in (err.value.details() or "")
        assert fake_api.pods(NAMESPACE) == []
    finally:
        cp.stop()
        cp.loop.run(backend.close())
        cp.loop.close()


def test_pool_members_of_an_allowlist_template_carry_its_policy(
    plane: ControlPlane, fake_api: FakeApiServer
) -> None:
    wait_pool_ready(plane, "web", 1)
    (member,) = free_members(fake_api, "web")[:1]
    pod = fake_api.pod(NAMESPACE, member)
    assert pod is not None and pod["metadata"]["labels"][m.NETWORK] == "allowlist"
    assert f"orchard-sandbox-{member}-egress" in egress_policies(fake_api)
    assert proxy_table(fake_api)[f"{member}.json"]["policy"]["domains"] == ["pypi.org"]
    claimed = plane.stub.CreateSandbox(
        sandbox_pb2.CreateSandboxRequest(template="web"), metadata=plane.auth()
    )
    assert claimed.id == member
    assert list(claimed.network.domains) == ["pypi.org"]
    assert claimed.executor.address == pod_address(fake_api, member)
