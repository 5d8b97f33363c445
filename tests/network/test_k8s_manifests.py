"""The Kubernetes compilation of network policy, validated offline against the
official OpenAPI schemas (kubernetes-validate, strict), as the Kubernetes
backend's own manifests are (``tests/kubernetes/schemas.py``). No cluster."""

from __future__ import annotations

import ipaddress
import json

import pytest
from orchard.scheduler.backends.base import BackendError
from orchard.scheduler.backends.kubernetes.manifests import NETWORK, SANDBOX_ID
from orchard.scheduler.backends.netpolicy.k8s import (
    compile_sandbox,
    pod_labels,
    proxy_policies_configmap,
    proxy_table_patch,
    read_proxy_table,
    sandbox_egress_policy,
)
from orchard.scheduler.backends.netpolicy.policy import NetworkPolicySpec, build_policy

from tests.kubernetes.schemas import KUBERNETES_VERSIONS, schema_errors

CLUSTER = ("10.244.0.0/16", "10.96.0.0/12")


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_allowlist_cidrs_compile_to_a_valid_per_sandbox_policy(version: str) -> None:
    policy = build_policy("allowlist", ["10.0.0.0/8", "203.0.113.0/24"], [443], ["pypi.org"])
    manifest = sandbox_egress_policy("sb-abc123", "orchard-sandboxes", policy, CLUSTER)
    assert manifest is not None
    assert schema_errors(manifest, version) == []
    spec = manifest["spec"]
    assert spec["podSelector"] == {"matchLabels": {SANDBOX_ID: "sb-abc123"}}
    assert spec["policyTypes"] == ["Egress"]
    (rule,) = spec["egress"]
    blocks = {peer["ipBlock"]["cidr"]: peer["ipBlock"].get("except") for peer in rule["to"]}
    # The cluster's own ranges are cut out of a wide block.
    assert blocks == {"10.0.0.0/8": ["10.244.0.0/16", "10.96.0.0/12"], "203.0.113.0/24": None}
    assert rule["ports"] == [{"protocol": "TCP", "port": 443}, {"protocol": "UDP", "port": 443}]


def test_a_block_inside_the_cluster_is_refused() -> None:
    policy = build_policy("allowlist", ["10.244.3.0/24"], [], [])
    with pytest.raises(BackendError, match="cluster's own ranges"):
        sandbox_egress_policy("sb-abc123", "ns", policy, CLUSTER)


def test_modes_without_cidrs_need_no_per_sandbox_policy() -> None:
    for policy in (
        NetworkPolicySpec(),
        NetworkPolicySpec("internet"),
        build_policy("allowlist", [], [], ["pypi.org"]),
    ):
        assert compile_sandbox("sb-abc123", "ns", policy, CLUSTER) == []
        assert pod_labels(policy) == {NETWORK: policy.mode}


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_proxy_table_configmap(version: str) -> None:
    allow = build_policy("allowlist", [], [], ["pypi.org"])
    manifest = proxy_policies_configmap(
        "orchard-system",
        {
            "sb-b": ("10.244.1.7", allow),
            "sb-a": ("10.244.1.8", NetworkPolicySpec("internet")),
            "sb-c": ("10.244.1.9", NetworkPolicySpec()),
        },
    )
    assert schema_errors(manifest, version) == []
    assert sorted(manifest["data"]) == ["sb-a.json", "sb-b.json"]  # "none" needs no entry
    entry = json.loads(manifest["data"]["sb-b.json"])
    assert entry["address"] == "10.244.1.7"
    assert entry["policy"]["domains"] == ["pypi.org"]
    # What the proxy reads back: pod IP -> policy.
    table = read_proxy_table(manifest["data"])
    assert table == {
        ipaddress.IPv4Address("10.244.1.7"): allow,
        ipaddress.IPv4Address("10.244.1.8"): NetworkPolicySpec("internet"),
    }


def test_proxy_table_patches_set_and_drop_one_entry() -> None:
    allow = build_policy("allowlist", [], [], ["pypi.org"])
    set_patch = proxy_table_patch("sb-x", "10.244.0.5", allow)
    assert json.loads(set_patch["data"]["sb-x.json"])["address"] == "10.244.0.5"
    assert proxy_table_patch("sb-x") == {"data": {"sb-x.json": None}}
    assert proxy_table_patch("sb-x", "10.244.0.5", NetworkPolicySpec()) == {
        "data": {"sb-x.json": None}
    }
    with pytest.raises(ValueError):
        proxy_table_patch("sb-x", "not-an-ip; rm -rf /", allow)
    # Hostile or broken table files are skipped, not fatal to the proxy.
    assert read_proxy_table({"a.json": "{", "b.json": '{"address": "x"}', "c.txt": "{}"}) == {}
