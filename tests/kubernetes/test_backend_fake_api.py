"""The Kubernetes backend's logic, offline: the real ``kubernetes`` client over real HTTP
to a FAKE API server on loopback (tests/kubernetes/fake_apiserver.py; no cluster runs here).
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest
from orchard.scheduler.backends.base import BackendError, check_capabilities
from orchard.scheduler.backends.kubernetes import KubernetesBackend, KubernetesSettings
from orchard.scheduler.backends.kubernetes import manifests as m
from orchard.scheduler.backends.kubernetes.pod_status import pod_state
from orchard.scheduler.backends.registry import load_backend
from orchard.scheduler.settings import SchedulerSettings

from . import lifecycle
from .conftest import NAMESPACE, random_keyring, started_backend
from .fake_apiserver import FakeApiServer, parse_selector, selector_matches

pytestmark = pytest.mark.timeout(60)


def test_create_list_recover_delete(fake_api: FakeApiServer) -> None:
    asyncio.run(lifecycle.create_list_recover_delete(lambda: started_backend(fake_api)))


def test_concurrent_claims_from_three_replicas_never_share_a_pod(fake_api: FakeApiServer) -> None:
    asyncio.run(
        lifecycle.concurrent_claims_never_share(
            lambda: started_backend(fake_api), "py", members=4, claimers=12
        )
    )


def test_claim_with_stale_resource_version_gets_409_and_takes_the_next_pod(
    fake_api: FakeApiServer,
) -> None:
    async def scenario() -> None:
        a = await started_backend(fake_api)
        b = await started_backend(fake_api)
        ids = [lifecycle.new_id(), lifecycle.new_id()]
        for i in ids:
            await a.create_pool_member(lifecycle.small_spec(i), "py")
        await b.cache.wait_for(
            lambda: all(
                (b.cache.get(i) or {}).get("status", {}).get("phase") == "Running" for i in ids
            ),
            10,
        )
        # Freeze b's view of the first pod, then let a claim it: b's claim must lose on it.
        a_first = await a.claim("py", tenant="alpha", ttl_seconds=60)
        assert a_first is not None
        stale = fake_api.pod(NAMESPACE, a_first.sandbox_id)
        assert stale is not None
        # Put the pre-claim object back into b's cache, as if b had not seen the claim yet.
        old = dict(stale)
        old["metadata"] = dict(
            stale["metadata"], resourceVersion=str(int(stale["metadata"]["resourceVersion"]) - 1)
        )
        old["metadata"]["labels"] = dict(stale["metadata"]["labels"], **{m.CLAIM: m.CLAIM_FREE})
        b.cache._pods[a_first.sandbox_id] = old
        won = await b.claim("py", tenant="beta", ttl_seconds=60)
        assert won is not None and won.sandbox_id != a_first.sandbox_id
        assert b.claim_stats.conflicts + b.claim_stats.claims >= 1
        on_server = fake_api.pod(NAMESPACE, a_first.sandbox_id)
        assert on_server is not None and on_server["metadata"]["annotations"][m.A_TENANT] == "alpha"
        assert await b.claim("py", tenant="gamma", ttl_seconds=60) is None
        assert b.claim_stats.misses == 1
        for i in ids:
            await a.delete(i)
        await a.close()
        await b.close()

    asyncio.run(scenario())


def test_claim_lowers_the_deadline_to_ttl_plus_grace(fake_api: FakeApiServer) -> None:
    async def scenario() -> None:
        backend = await started_backend(fake_api, ttl_backstop_grace_seconds=30)
        sid = lifecycle.new_id()
        await backend.create_pool_member(lifecycle.small_spec(sid), "py")
        before = fake_api.pod(NAMESPACE, sid)
        assert before is not None
        assert (
            before["spec"]["activeDeadlineSeconds"] == backend.settings.unclaimed_lifetime_seconds
        )
        assert before["metadata"]["labels"][m.CLAIM] == m.CLAIM_FREE
        claimed = await backend.claim("py", tenant="t", ttl_seconds=120, labels={"run": "7"})
        assert claimed is not None
        after = fake_api.pod(NAMESPACE, sid)
        assert after is not None
        assert 150 <= after["spec"]["activeDeadlineSeconds"] <= 152
        assert after["metadata"]["labels"][m.TENANT] == "t"
        assert claimed.user_labels == {"run": "7"}
        await backend.delete(sid)
        await backend.close()

    asyncio.run(scenario())


def test_watch_survives_410_gone_by_relisting(fake_api: FakeApiServer) -> None:
    async def scenario() -> None:
        backend = await started_backend(fake_api)
        first = lifecycle.new_id()
        await backend.create_pod(lifecycle.small_spec(first), tenant="t", ttl_seconds=60)
        # The backend's watch is cut and held back while another replica works
        # and the history is compacted: its resourceVersion is then too old.
        fake_api.pause_watches()
        fake_api.drop_watches()
        other = await started_backend(fake_api)
        second = lifecycle.new_id()
        await other.create_pod(lifecycle.small_spec(second), tenant="t", ttl_seconds=60)
        await other.delete(first)
        fake_api.compact()
        assert backend.cache.get(second) is None and backend.cache.get(first) is not None
        fake_api.resume_watches()
        assert await backend.cache.wait_for(lambda: backend.cache.get(second) is not None, 15)
        assert backend.cache.relists >= 1
        # The pod deleted meanwhile dropped out with the relist.
        assert backend.cache.get(first) is None
        await other.delete(second)
        await other.close()
        await backend.close()

    asyncio.run(scenario())


def test_429_with_retry_after_is_retried(fake_api: FakeApiServer) -> None:
    async def scenario() -> None:
        backend = await started_backend(fake_api)
        fake_api.inject("POST", "/pods", 429, retry_after=1, times=2)
        started = time.monotonic()
        sid = lifecycle.new_id()
        made = await backend.create_pod(lifecycle.small_spec(sid), tenant="t", ttl_seconds=60)
        waited = time.monotonic() - started
        assert made.running
        assert backend.api.retries == 2
        assert waited >= 2.0, f"Retry-After: 1 twice, yet only {waited:.2f} s passed"
        posts = [p for meth, p in fake_api.requests if meth == "POST" and p.endswith("/pods")]
        assert len(posts) == 3
        await backend.delete(sid)
        await backend.close()

    asyncio.run(scenario())


def test_persistent_429_becomes_a_clear_backend_failure(fake_api: FakeApiServer) -> None:
    async def scenario() -> None:
        backend = await started_backend(fake_api, max_retries=2, max_retry_after_seconds=0.1)
        fake_api.inject("POST", "/pods", 429, retry_after=5, times=10)
        with pytest.raises(BackendError) as err:
            await backend.create_pod(
                lifecycle.small_spec(lifecycle.new_id()), tenant="t", ttl_seconds=60
            )
        assert err.value.reason == "BACKEND_FAILURE" and not err.value.client_fault
        assert "429" in err.value.message
        await backend.close()

    asyncio.run(scenario())


def test_missing_image_fails_as_client_fault_and_leaves_no_pod(fake_api: FakeApiServer) -> None:
    async def scenario() -> None:
        backend = await started_backend(fake_api)
        sid = lifecycle.new_id()
        with pytest.raises(BackendError) as err:
            await backend.create_pod(
                lifecycle.small_spec(sid, image="missing/nope:1"), tenant="t", ttl_seconds=60
            )
        assert err.value.reason == "IMAGE_NOT_FOUND" and err.value.client_fault
        assert fake_api.pod(NAMESPACE, sid) is None
        await backend.close()

    asyncio.run(scenario())


def test_not_ready_in_time_fails_as_infrastructure_and_is_removed(fake_api: FakeApiServer) -> None:
    async def scenario() -> None:
        fake_api.auto_ready = False
        backend = await started_backend(fake_api, ready_timeout_seconds=0.5)
        sid = lifecycle.new_id()
        with pytest.raises(BackendError) as err:
            await backend.create_pod(lifecycle.small_spec(sid), tenant="t", ttl_seconds=60)
        assert not err.value.client_fault and "not ready within" in err.value.message
        assert fake_api.pod(NAMESPACE, sid) is None
        await backend.close()

    asyncio.run(scenario())


@pytest.mark.parametrize(
    ("status", "reason"),
    [
        (
            {
                "conditions": [
                    {
                        "type": "DisruptionTarget",
                        "status": "True",
                        "reason": "PreemptionByScheduler",
                    }
                ]
            },
            "PREEMPTED",
        ),
        (
            {"phase": "Failed", "reason": "Shutdown", "message": "node shutdown (spot reclaim)"},
            "PREEMPTED",
        ),
        ({"phase": "Failed", "reason": "DeadlineExceeded"}, "EXPIRED"),
    ],
)
def test_platform_failures_are_infrastructure_faults(
    fake_api: FakeApiServer, status: dict[str, object], reason: str
) -> None:
    async def scenario() -> None:
        backend = await started_backend(fake_api)
        sid = lifecycle.new_id()
        await backend.create_pod(lifecycle.small_spec(sid), tenant="t", ttl_seconds=60)
        assert await backend.failure(sid) is None
        fake_api.set_status(NAMESPACE, sid, status)
        assert await backend.cache.wait_for(
            lambda: pod_state(backend.cache.get(sid) or {}).failed, 10
        )
        failed = await backend.failure(sid)
        assert failed is not None and failed.reason == reason and not failed.client_fault
        inspected = await backend.inspect(sid)
        assert inspected is not None and not inspected.running
        await backend.delete(sid)
        await backend.close()

    asyncio.run(scenario())


def test_retried_create_of_the_same_id_adopts_its_own_pod(fake_api: FakeApiServer) -> None:
    async def scenario() -> None:
        backend = await started_backend(fake_api)
        sid = lifecycle.new_id()
        first, second = await asyncio.gather(
            backend.create_pod(lifecycle.small_spec(sid), tenant="t", ttl_seconds=60),
            backend.create_pod(lifecycle.small_spec(sid), tenant="t", ttl_seconds=60),
        )
        assert first.sandbox_id == second.sandbox_id == sid
        assert len([p for p in fake_api.pods(NAMESPACE) if p["metadata"]["name"] == sid]) == 1
        await backend.delete(sid)
        await backend.close()

    asyncio.run(scenario())


def test_bad_input_is_refused_before_any_api_call(fake_api: FakeApiServer) -> None:
    async def scenario() -> None:
        backend = await started_backend(fake_api)
        calls = len(fake_api.requests)
        for bad in ("../etc", "SB-UPPER", "sb-x\n", "a" * 80, "sb-ends-with-"):
            with pytest.raises(BackendError) as err:
                await backend.create_pod(lifecycle.small_spec(bad), tenant="t", ttl_seconds=60)
            assert err.value.client_fault
        assert len(fake_api.requests) == calls
        # A template with no pod settings of its own (the scheduler's templates.toml
        # names the pools) is made from the default pod template under its name.
        sid = lifecycle.new_id()
        await backend.create_pod(
            lifecycle.small_spec(sid), tenant="t", ttl_seconds=60, template="plain"
        )
        pod = fake_api.pod(NAMESPACE, sid)
        assert pod is not None and pod["metadata"]["labels"]["orchard.dev/pool"] == "plain"
        assert pod["spec"]["containers"][0]["image"] == backend.settings.default_image
        await backend.delete(sid)
        await backend.close()

    asyncio.run(scenario())


def test_network_policies_are_created_then_replaced(fake_api: FakeApiServer) -> None:
    async def scenario() -> None:
        backend = await started_backend(fake_api)
        names = await backend.ensure_network_policies()
        assert "orchard-sandbox-default-deny" in names
        again = await backend.ensure_network_policies()  # second run replaces, no 409 leaks
        assert again == names
        stored = {p["metadata"]["name"]: p for p in fake_api.objects("networkpolicies", NAMESPACE)}
        assert set(stored) == set(names)
        assert stored["orchard-sandbox-default-deny"]["spec"]["policyTypes"] == [
            "Ingress",
            "Egress",
        ]
        await backend.close()

    asyncio.run(scenario())


def test_load_backend_by_name_makes_a_kubernetes_backend(
    fake_api: FakeApiServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("ORCHARD_K8S_POD_SETTINGS", raising=False)
    monkeypatch.setenv("ORCHARD_K8S_API_HOST", fake_api.url)
    backend = load_backend("kubernetes", SchedulerSettings(home=tmp_path, backend="kubernetes"))
    assert isinstance(backend, KubernetesBackend) and backend.name == "kubernetes"
    assert backend.settings.api_host == fake_api.url
    check_capabilities(
        KubernetesBackend(KubernetesSettings(api_host=fake_api.url), keyring=random_keyring())
    )
    assert fake_api.requests == []  # no I/O until start()


def test_load_backend_refuses_an_unknown_name(tmp_path: Path) -> None:
    with pytest.raises(BackendError, match=r"unknown backend 'kube' \(known: kubernetes, local\)"):
        load_backend("kube", SchedulerSettings(home=tmp_path))


def test_fake_label_selectors() -> None:
    pod = {"metadata": {"labels": {"a": "1", "b": "x"}}}
    for sel, want in [
        ("a=1", True), ("a==1", True), ("a!=1", False), ("a in (1,2)", True), ("a notin (1,2)", False),
        ("b", True), ("!b", False), ("!c", True), ("a=1,b in (x, y)", True), ("a=1,b=y", False),
    ]:  # fmt: skip
        assert selector_matches(parse_selector(sel), pod) is want, sel
