"""charts/orchard rendered by Helm's own template engine (helm-python-sdk, offline) and every
object validated against the official Kubernetes OpenAPI schemas."""

from __future__ import annotations

import hashlib
import json
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml
from helm_python.chart import Chart, lint
from orchard.scheduler.backends.base import SandboxSpec
from orchard.scheduler.backends.kubernetes import KubernetesSettings, PodTemplate
from orchard.scheduler.backends.kubernetes import manifests as m
from orchard.scheduler.backends.netpolicy.k8s import PROXY_CONFIGMAP, sandbox_egress_policy
from orchard.scheduler.backends.netpolicy.policy import build_policy

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


TENANTS: dict[str, Any] = {
    "tenants": [{"name": "research", "apiKeySha256": hashlib.sha256(b"ork_test").hexdigest()}]
}
"""The chart refuses to render with no tenant key (tests/kubernetes/test_chart_security.py)."""


def with_tenants(values: dict[str, Any] | None) -> dict[str, Any]:
    values = dict(values or {})
    if "tenants" not in values and "tenantsExistingSecret" not in values:
        values.update(TENANTS)
    return values


def render(values: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    out = Chart.load(CHART).render(
        values=with_tenants(values), name="orchard", namespace=RELEASE_NS
    )
    docs: list[dict[str, Any]] = []
    for text in out.values():
        docs += [d for d in yaml.safe_load_all(text) if d]
    return docs


@pytest.fixture(scope="module", params=["defaults", "overrides"])
def rendered(request: pytest.FixtureRequest) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    values = {} if request.param == "defaults" else OVERRIDES
    return values, render(values)


def test_helm_lint_has_no_errors() -> None:
    assert lint(str(CHART), TENANTS)["errors"] == []


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
    roles = {d["metadata"]["namespace"]: d for d in docs if d["kind"] == "Role"}
    assert sorted(roles) == sorted({sandbox_ns, RELEASE_NS})
    granted = {
        (g, r)
        for rule in roles[sandbox_ns]["rules"]
        for g in rule["apiGroups"]
        for r in rule["resources"]
    }
    # Secrets: each sandbox pod's own token Secret, by name (no list or watch).
    assert granted == {("", "pods"), ("", "secrets"), ("networking.k8s.io", "networkpolicies")}
    secret_rules = [r for r in roles[sandbox_ns]["rules"] if r["resources"] == ["secrets"]]
    assert [sorted(r["verbs"]) for r in secret_rules] == [["create", "delete", "get", "patch"]]
    # In its own namespace: only the egress table ConfigMap (create cannot name it).
    table_rules = roles[RELEASE_NS]["rules"]
    assert all(rule["resources"] == ["configmaps"] for rule in table_rules)
    for rule in table_rules:
        assert rule.get("resourceNames") == [PROXY_CONFIGMAP] or rule["verbs"] == ["create"]
    for role in roles.values():
        for rule in role["rules"]:
            assert "*" not in rule["verbs"] and "escalate" not in rule["verbs"]
    for binding in (d for d in docs if d["kind"] == "RoleBinding"):
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
    got = [
        d for d in docs if d["kind"] == "NetworkPolicy" and d["metadata"]["namespace"] != RELEASE_NS
    ]
    assert sorted(got, key=lambda d: d["metadata"]["name"]) == sorted(
        want, key=lambda d: d["metadata"]["name"]
    )


def test_the_node_token_key_stays_out_of_the_sandbox_namespace() -> None:
    """Sandbox pods get keys derived for them (their own Secrets, made by the scheduler);
    the node key a pod could read would mint tokens for every sandbox."""
    docs = render()
    secrets = [
        d
        for d in docs
        if d["kind"] == "Secret" and d["metadata"]["name"] == "orchard-executor-token"
    ]
    assert {s["metadata"]["namespace"] for s in secrets} == {RELEASE_NS}
    assert not [
        d
        for d in docs
        if d["kind"] == "Secret" and d["metadata"]["namespace"] == "orchard-sandboxes"
    ]


def test_pools_config_parses(
    rendered: tuple[dict[str, Any], list[dict[str, Any]]],
) -> None:
    values, docs = rendered
    cm = next(d for d in docs if d["kind"] == "ConfigMap")
    templates = tomllib.loads(cm["data"]["templates.toml"])["templates"]
    pods = json.loads(cm["data"]["pods.json"])
    pools = values.get("pools") or [{"name": "py-small"}]
    assert set(templates) == set(pods) == {p["name"] for p in pools}
    if values:
        assert templates["swe-spot"]["memory_bytes"] == 8589934592
        assert pods["swe-spot"]["tolerations"][0]["key"] == "orchard.dev/spot"
        assert pods["swe-spot"]["runtime_class_name"] == "gvisor"
        assert pods["swe-spot"]["run_as_user"] == 65532


def test_non_root_pool_without_uid_is_refused_at_render() -> None:
    bad = {"pools": [dict(OVERRIDES["pools"][0], runAsUser=None)]}
    with pytest.raises(Exception, match="runAsUser is needed"):
        render(bad)


def _deployment(docs: list[dict[str, Any]], name: str) -> dict[str, Any]:
    return next(d for d in docs if d["kind"] == "Deployment" and d["metadata"]["name"] == name)


def _selects(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in (selector.get("matchLabels") or {}).items())


def test_the_chart_and_the_network_compiler_agree(
    rendered: tuple[dict[str, Any], list[dict[str, Any]]],
) -> None:
    """The class policies the chart installs, the per-sandbox policy the compiler
    makes, the pods the backend makes and the egress proxy the chart deploys fit."""
    values, docs = rendered
    sbx = values.get("sandboxes", {})
    ns = sbx.get("namespace", "orchard-sandboxes")
    proxy_port = sbx.get("egressProxyPort", 3128)
    policies = {d["metadata"]["name"]: d for d in docs if d["kind"] == "NetworkPolicy"}
    settings = KubernetesSettings(namespace=ns, control_namespace=RELEASE_NS)
    allow = build_policy("allowlist", ["198.51.100.0/24"], [443], ["pypi.org"])
    spec = SandboxSpec(sandbox_id="sb-abc123", network_mode="allowlist", network=allow)
    pod = m.sandbox_pod(spec, settings, PodTemplate(network_class="allowlist"), deadline_seconds=60)
    labels = pod["metadata"]["labels"]
    # The pod is under default deny and in exactly its class's egress policy.
    assert _selects(policies["orchard-sandbox-default-deny"]["spec"]["podSelector"], labels)
    egress_classes = [
        name for name, p in policies.items() if "Egress" in p["spec"]["policyTypes"] and
        name != "orchard-sandbox-default-deny" and _selects(p["spec"]["podSelector"], labels)
    ]  # fmt: skip
    assert egress_classes == ["orchard-sandbox-allowlist-egress"]
    # The compiler's per-sandbox policy selects that pod (and only by its id).
    own = sandbox_egress_policy("sb-abc123", ns, allow)
    assert own is not None and own["metadata"]["namespace"] == ns
    assert _selects(own["spec"]["podSelector"], labels)
    assert own["spec"]["podSelector"]["matchLabels"] == {m.SANDBOX_ID: "sb-abc123"}
    # The allowlist class reaches the proxy pods the chart deploys, on the Service's port.
    proxy = _deployment(docs, "orchard-egress-proxy")
    proxy_labels = proxy["spec"]["template"]["metadata"]["labels"]
    (rule,) = policies["orchard-sandbox-allowlist-egress"]["spec"]["egress"]
    (peer,) = rule["to"]
    assert peer["namespaceSelector"]["matchLabels"] == {"kubernetes.io/metadata.name": RELEASE_NS}
    assert _selects(peer["podSelector"], proxy_labels)
    assert rule["ports"] == [{"protocol": "TCP", "port": proxy_port}]
    service = next(
        d
        for d in docs
        if d["kind"] == "Service" and d["metadata"]["name"] == "orchard-egress-proxy"
    )
    assert service["spec"]["ports"][0]["port"] == proxy_port
    assert _selects({"matchLabels": service["spec"]["selector"]}, proxy_labels)
    # The proxy runs the same code as the local runtime, on the table the scheduler writes.
    container = proxy["spec"]["template"]["spec"]["containers"][0]
    assert container["args"][:3] == [
        "python", "-m", "orchard.scheduler.backends.netpolicy.proxy_server"
    ]  # fmt: skip
    assert f"--port={proxy_port}" in container["args"]
    (volume,) = proxy["spec"]["template"]["spec"]["volumes"]
    assert volume["configMap"]["name"] == PROXY_CONFIGMAP
    # The scheduler points pods at that Service and knows the cluster ranges.
    env = {
        e["name"]: e["value"]
        for e in _deployment(docs, "orchard-scheduler")["spec"]["template"]["spec"]["containers"][
            0
        ]["env"]
    }
    assert env["ORCHARD_K8S_EGRESS_PROXY"] == service["metadata"]["name"]
    assert env["ORCHARD_K8S_EGRESS_PROXY_PORT"] == str(proxy_port)
    assert "ORCHARD_K8S_CLUSTER_CIDRS" in env


def _gateway(docs: list[dict[str, Any]]) -> dict[str, Any]:
    return next(
        d for d in docs if d["kind"] == "Deployment" and d["metadata"]["name"] == "orchard-gateway"
    )


def test_the_gateway_serves_tls_from_the_secret_by_default() -> None:
    pod = _gateway(render({}))["spec"]["template"]["spec"]
    container = pod["containers"][0]
    args = container["args"]
    assert "--tls-cert=/etc/orchard/tls/tls.crt" in args
    assert "--tls-key=/etc/orchard/tls/tls.key" in args
    assert not any(a.startswith("--tls-client-ca") for a in args)
    mounts = {m["name"]: m for m in container["volumeMounts"]}
    assert mounts["tls"]["mountPath"] == "/etc/orchard/tls" and mounts["tls"]["readOnly"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    secret = volumes["tls"]["secret"]
    assert secret["secretName"] == "orchard-gateway-tls"
    assert {i["key"] for i in secret["items"]} == {"tls.crt", "tls.key"}  # cert-manager's keys
    # The mounted paths are the ones the args name.
    assert {f"/etc/orchard/tls/{i['path']}" for i in secret["items"]} == {
        a.split("=", 1)[1] for a in args if a.startswith(("--tls-cert=", "--tls-key="))
    }


def test_mutual_tls_and_plaintext_are_values() -> None:
    mtls = _gateway(render({"gateway": {"tls": {"clientCASecret": "trainers-ca"}}}))
    pod = mtls["spec"]["template"]["spec"]
    assert "--tls-client-ca=/etc/orchard/client-ca/ca.crt" in pod["containers"][0]["args"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["client-ca"]["secret"]["secretName"] == "trainers-ca"
    plain = _gateway(render({"gateway": {"tls": {"enabled": False}}}))
    pod = plain["spec"]["template"]["spec"]
    assert not any(a.startswith("--tls") for a in pod["containers"][0]["args"])
    assert "tls" not in {v["name"] for v in pod["volumes"]}


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_the_tls_variants_match_the_schema(version: str) -> None:
    values = {"gateway": {"tls": {"clientCASecret": "trainers-ca"}}}
    for doc in render(values):
        assert schema_errors(doc, version) == [], doc["metadata"]["name"]


def test_probes_ask_the_grpc_health_service(
    rendered: tuple[dict[str, Any], list[dict[str, Any]]],
) -> None:
    """The gateway and scheduler are probed with Kubernetes' native gRPC probe (the
    grpc.health.v1 service every Orchard service serves), for readiness and liveness, on a
    port the process serves in plaintext (the kubelet's probe cannot speak TLS): their
    health-only ports (``--health-listen``; the gateway's TLS or not, the scheduler's gRPC
    port speaks only mutual TLS with internal certificates);
    a sandbox pod's executor for readiness only (a liveness kill would end it)."""
    values, docs = rendered
    plain_gateway = render(
        {**values, "gateway": {**values.get("gateway", {}), "tls": {"enabled": False}}}
    )
    for chart in (docs, plain_gateway):
        for name, flag, port_name in (
            ("orchard-gateway", "--health-listen=", "health"),
            ("orchard-scheduler", "--health-listen=", "health"),
        ):
            container = _deployment(chart, name)["spec"]["template"]["spec"]["containers"][0]
            port = next(p["containerPort"] for p in container["ports"] if p["name"] == port_name)
            (listen,) = [a for a in container["args"] if a.startswith(flag)]
            assert listen.endswith(f":{port}")
            assert container["readinessProbe"]["grpc"] == {"port": port}
            assert container["livenessProbe"]["grpc"] == {"port": port}
    settings = KubernetesSettings(executor_port=7171)
    spec = SandboxSpec(sandbox_id="sb-probe1", tenant="dev")
    pod = m.sandbox_pod(spec, settings, PodTemplate(), deadline_seconds=60)
    task = pod["spec"]["containers"][0]
    assert task["readinessProbe"]["grpc"] == {"port": 7171}
    assert "livenessProbe" not in task
