"""The Kubernetes side of network policy: a sandbox's policy as manifests.

The class-level policies of the sandbox namespace (default deny, executor
ingress, ``internet`` egress without private ranges, ``allowlist`` egress to
the egress proxy only) are the Kubernetes backend's
(``kubernetes.manifests.sandbox_network_policies``); a pod joins its class by
the ``orchard.dev/network`` label. What is per sandbox is compiled here:

- ``allowlist`` CIDRs (and ports) become one NetworkPolicy selecting the pod
  by ``orchard.dev/sandbox-id``; the cluster's own ranges (pod and service
  CIDRs) are cut out of every allowed block (``except``), and a block inside
  them is refused, so no allowlist reaches other pods;
- ``allowlist`` domains go through the same egress proxy as on one machine
  (it resolves names itself, see ``proxy_server``); its table entry for the
  sandbox (``<sandbox id>.json``: the pod IP the proxy knows it by, and the
  policy) lives in the ConfigMap this module builds, which the Kubernetes
  backend patches key by key as pods come, change policy and go.

IPv4 only, like the local network.
"""

from __future__ import annotations

import ipaddress
import json
from typing import Any

from ..base import BackendError
from ..kubernetes.manifests import NETWORK, SANDBOX_ID, network_policy
from .policy import MODE_ALLOWLIST, NetworkPolicySpec

Manifest = dict[str, Any]
PROXY_CONFIGMAP = "orchard-egress-policies"


def pod_labels(policy: NetworkPolicySpec) -> dict[str, str]:
    """The label that puts the pod in its policy class."""
    return {NETWORK: policy.mode}


def _blocks(policy: NetworkPolicySpec, cluster_cidrs: tuple[str, ...]) -> list[Manifest]:
    cluster = [ipaddress.IPv4Network(c) for c in cluster_cidrs]
    peers: list[Manifest] = []
    for net in policy.networks:
        if any(net.subnet_of(c) for c in cluster):
            raise BackendError.invalid(
                f"network.cidrs: {net} is inside the cluster's own ranges "
                f"({', '.join(cluster_cidrs)}), which sandboxes never reach"
            )
        cut = sorted(str(c) for c in cluster if c.subnet_of(net) and c != net)
        block: Manifest = {"cidr": str(net)}
        if cut:
            block["except"] = cut
        peers.append({"ipBlock": block})
    return peers


def sandbox_egress_policy(
    sandbox_id: str,
    namespace: str,
    policy: NetworkPolicySpec,
    cluster_cidrs: tuple[str, ...] = (),
) -> Manifest | None:
    """The per-sandbox NetworkPolicy for an allowlist's CIDRs; None when there are none."""
    if policy.mode != MODE_ALLOWLIST or not policy.cidrs:
        return None
    rule: Manifest = {"to": _blocks(policy, cluster_cidrs)}
    if policy.ports:
        rule["ports"] = [
            {"protocol": proto, "port": port} for port in policy.ports for proto in ("TCP", "UDP")
        ]
    return network_policy(
        sandbox_egress_policy_name(sandbox_id),
        namespace,
        {SANDBOX_ID: sandbox_id},
        egress=[rule],
        policy_types=("Egress",),
    )


def proxy_table_key(sandbox_id: str) -> str:
    return f"{sandbox_id}.json"


def proxy_table_entry(address: str, policy: NetworkPolicySpec, tenant: str = "") -> str:
    """One sandbox's line in the proxy table: the pod IP requests come from, its policy and
    its tenant (the proxy's per-tenant caps share one budget between a tenant's pods)."""
    ipaddress.IPv4Address(address)  # refuse anything but an IPv4 pod IP
    entry = {"address": address, "policy": json.loads(policy.to_json())}
    if tenant:
        entry["tenant"] = tenant
    return json.dumps(entry, sort_keys=True)


def read_proxy_entries(
    files: dict[str, str],
) -> dict[ipaddress.IPv4Address, tuple[NetworkPolicySpec, str]]:
    """The proxy's view of the table (file name -> text): address -> (policy, tenant; "" if
    the entry names none); malformed entries are skipped."""
    table: dict[ipaddress.IPv4Address, tuple[NetworkPolicySpec, str]] = {}
    for name, text in files.items():
        if not name.endswith(".json"):
            continue
        try:
            data = json.loads(text)
            address = ipaddress.IPv4Address(str(data["address"]))
            policy = NetworkPolicySpec.from_json(json.dumps(data["policy"]))
            tenant = str(data.get("tenant", ""))
        except (ValueError, KeyError, TypeError, AttributeError):
            continue
        if policy.networked:
            table[address] = (policy, tenant)
    return table


def read_proxy_table(files: dict[str, str]) -> dict[ipaddress.IPv4Address, NetworkPolicySpec]:
    """:func:`read_proxy_entries` without the tenants."""
    return {address: policy for address, (policy, _) in read_proxy_entries(files).items()}


def proxy_table_patch(
    sandbox_id: str, address: str = "", policy: NetworkPolicySpec | None = None, tenant: str = ""
) -> Manifest:
    """A merge patch of the table ConfigMap: set the sandbox's entry, or drop it (no policy)."""
    key = proxy_table_key(sandbox_id)
    if policy is None or not policy.networked or not address:
        return {"data": {key: None}}
    return {"data": {key: proxy_table_entry(address, policy, tenant)}}


def proxy_policies_configmap(
    namespace: str, entries: dict[str, tuple[str, NetworkPolicySpec]] | None = None
) -> Manifest:
    """The egress proxy's table: ``<sandbox id>.json`` per allowlist/internet sandbox
    (``entries``: sandbox id -> (pod IP, policy)); the chart creates it empty."""
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": PROXY_CONFIGMAP,
            "namespace": namespace,
            "labels": {"app.kubernetes.io/managed-by": "orchard"},
        },
        "data": {
            proxy_table_key(sandbox_id): proxy_table_entry(address, policy)
            for sandbox_id, (address, policy) in sorted((entries or {}).items())
            if policy.networked
        },
    }


def sandbox_egress_policy_name(sandbox_id: str) -> str:
    return f"orchard-sandbox-{sandbox_id}-egress"


def compile_sandbox(
    sandbox_id: str,
    namespace: str,
    policy: NetworkPolicySpec,
    cluster_cidrs: tuple[str, ...] = (),
) -> list[Manifest]:
    """Every per-sandbox object the policy needs (the class policies exist already)."""
    egress = sandbox_egress_policy(sandbox_id, namespace, policy, cluster_cidrs)
    return [] if egress is None else [egress]
