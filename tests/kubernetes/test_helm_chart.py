"""charts/orchard rendered by Helm's own template engine (helm-python-sdk, offline) and every
object validated against the official Kubernetes OpenAPI schemas."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml
from helm_python.chart import Chart, lint
from orchard.scheduler.backends.kubernetes import KubernetesSettings
from orchard.scheduler.backends.kubernetes import manifests as m

from .schemas import KUBERNETES_VERSIONS, schema_errors

CHART = Path(__file__).resolve().parents[2] / "charts" / "orchard"
RELEASE_NS = "orchard"

OVERRIDES: dict[str, Any] = {
    "sandboxes": {
        "namespace": "sbx",
        "createNamespace": False,
        "executorClientCIDRs": ["192.0.2.0/24"],
    },
    "bundle": {"executorPort": 7171},
    "pools": [
        {
            "name": "swe-spot",
            "image": "python:3.12-slim",
            "cpuMillis": 2000,
            "memoryBytes": 8589934592,
            "network": "internet",
            "runtimeClass": "gvisor",
            "runAsNonRoot": True,
            "runAsUser": 65532,
            "spot": True,
            "min": 16,
            "max": 128,
        }
    ],
}


def render(values: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    out = Chart.load(CHART).render(values=values, name="orchard", namespace=RELEASE_NS)
    docs: list[dict[str, Any]] = []
    for text in out.values():
        docs += [d for d in yaml.safe_load_all(text) if d]
    return docs


@pytest.fixture(scope="module", params=["defaults", "overrides"])
def rendered(request: pytest.FixtureRequest) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    values = {} if request.param == "defaults" else OVERRIDES
    return values, render(values)


def test_helm_lint_has_no_errors() -> None:
    assert lint(str(CHART))["errors"] == []


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_every_object_matches_the_schema(
    rendered: tuple[dict[str, Any], list[dict[str, Any]]], version: str
) -> None:
    _values, docs = rendered
    kinds = {d["kind"] for d in docs}
    assert {
        "Deployment",
        "Service",
        "Role",
        "RoleBinding",
        "NetworkPolicy",
        "ServiceAccount",
        "Secret",
        "ConfigMap",
    } <= kinds
    errors = [e for d in docs for e in schema_errors(d, version)]
    assert errors == []


def test_rbac_is_least_privilege(rendered: tuple[dict[str, Any], list[dict[str, Any]]]) -> None:
    values, docs = rendered
    sandbox_ns = values.get("sandboxes", {}).get("namespace", "orchard-sandboxes")
    assert not [d for d in docs if d["kind"] in ("ClusterRole", "ClusterRoleBinding")]
    roles = [d for d in docs if d["kind"] == "Role"]
    assert len(roles) == 1 and roles[0]["metadata"]["namespace"] == sandbox_ns
    granted = {
        (g, r) for rule in roles[0]["rules"] for g in rule["apiGroups"] for r in rule["resources"]
    }
    assert granted == {("", "pods"), ("networking.k8s.io", "networkpolicies")}
    for rule in roles[0]["rules"]:
        assert "*" not in rule["verbs"] and "escalate" not in rule["verbs"]
    binding = next(d for d in docs if d["kind"] == "RoleBinding")
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "orchard-scheduler", "namespace": RELEASE_NS}
    ]
    gateway = next(
        d for d in docs if d["kind"] == "Deployment" and d["metadata"]["name"] == "orchard-gateway"
    )
    assert gateway["spec"]["template"]["spec"]["automountServiceAccountToken"] is False


def test_sandbox_network_policies_equal_the_backends(
    rendered: tuple[dict[str, Any], list[dict[str, Any]]],
) -> None:
    values, docs = rendered
    sbx = values.get("sandboxes", {})
    settings = KubernetesSettings(
        namespace=sbx.get("namespace", "orchard-sandboxes"),
        control_namespace=RELEASE_NS,
        executor_port=values.get("bundle", {}).get("executorPort", 7070),
    )
    want = m.sandbox_network_policies(
        settings, client_cidrs=tuple(sbx.get("executorClientCIDRs", ()))
    )
    got = [d for d in docs if d["kind"] == "NetworkPolicy"]
    assert sorted(got, key=lambda d: d["metadata"]["name"]) == sorted(
        want, key=lambda d: d["metadata"]["name"]
    )


def test_one_token_key_in_both_namespaces() -> None:
    docs = render()
    secrets = [d for d in docs if d["kind"] == "Secret"]
    assert {s["metadata"]["namespace"] for s in secrets} == {RELEASE_NS, "orchard-sandboxes"}
    assert len({s["data"]["token.key"] for s in secrets}) == 1


def test_pools_and_tenants_config_parses(
    rendered: tuple[dict[str, Any], list[dict[str, Any]]],
) -> None:
    values, docs = rendered
    cm = next(d for d in docs if d["kind"] == "ConfigMap")
    templates = tomllib.loads(cm["data"]["templates.toml"])["templates"]
    tenants = tomllib.loads(cm["data"]["tenants.toml"])["tenants"]
    pods = json.loads(cm["data"]["pods.json"])
    pools = values.get("pools") or [{"name": "py-small"}]
    assert set(templates) == set(pods) == {p["name"] for p in pools}
    assert "research" in tenants and len(tenants["research"]["api_key_sha256"]) == 64
    if values:
        assert templates["swe-spot"]["memory_bytes"] == 8589934592
        assert pods["swe-spot"]["tolerations"][0]["key"] == "orchard.dev/spot"
        assert pods["swe-spot"]["runtime_class_name"] == "gvisor"
        assert pods["swe-spot"]["run_as_user"] == 65532


def test_non_root_pool_without_uid_is_refused_at_render() -> None:
    bad = {"pools": [dict(OVERRIDES["pools"][0], runAsUser=None)]}
    with pytest.raises(Exception, match="runAsUser is needed"):
        render(bad)
