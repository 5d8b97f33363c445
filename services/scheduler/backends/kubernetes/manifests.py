"""Manifest builders: sandbox pods and sandbox NetworkPolicies as plain dicts.

Pure functions (no client, no I/O), so the backend, the Helm chart tests and the
network-policy compiler build exactly the same objects, and the offline tests
validate them against the Kubernetes OpenAPI schemas.

What a sandbox pod is, and why:

- an init container (the executor bundle image) copies the bundle into an
  ``emptyDir`` (``/.orchard``, read-only in the task container), puts the
  token keys and ``sandbox.json`` into a second, writable ``emptyDir``
  (``/.orchard/run``); the executor removes the key file before any sandbox
  command runs;
- the token keys come from the sandbox's **own** Secret (``<id>-token``,
  :func:`sandbox_token_secret`, mounted into the init container only): the
  keys derived for this sandbox from each of the node's key ids
  (``tokens.encode_sandbox_keys``), never the node key, so a key read out of
  one pod cannot mint tokens for another sandbox; the Secret is owned by its
  pod (``ownerReferences``), so it goes when the pod goes;
- the task container keeps its image unmodified; only its command is replaced
  by the bundle's executor, which clients reach at the pod IP (never through
  the API server);
- requests = limits (Guaranteed QoS: a sandbox is never squeezed by a
  neighbour), ``restartPolicy: Never`` (a crashed sandbox is FAILED, not
  silently restarted with its state gone), ``activeDeadlineSeconds`` as the TTL
  backstop the kubelet enforces even when the scheduler is down;
- no service-account token, no service links, seccomp RuntimeDefault, no
  privilege escalation, capabilities dropped to a short list, optional
  ``runtimeClassName`` (gVisor, Kata) and non-root where the image allows.
"""

from __future__ import annotations

import base64
import json
import re
from collections.abc import Mapping
from typing import Any

from ..base import NETWORK_NONE, BackendError, SandboxSpec
from .settings import KubernetesSettings, PodTemplate

Manifest = dict[str, Any]

# ---- labels and annotations: the pods are the source of truth -----------------

MANAGED_BY = "app.kubernetes.io/managed-by"
MANAGED_BY_VALUE = "orchard"
ROLE = "orchard.dev/role"
ROLE_SANDBOX = "sandbox"
SANDBOX_ID = "orchard.dev/sandbox-id"
TENANT = "orchard.dev/tenant"
POOL = "orchard.dev/pool"
CLAIM = "orchard.dev/claim"
CLAIM_FREE = "free"
CLAIMED = "claimed"
NETWORK = "orchard.dev/network"
# Annotations (free text, not selectable).
A_TENANT = "orchard.dev/tenant"
A_SPEC = "orchard.dev/spec"
A_CREATED_AT = "orchard.dev/created-at"
A_CLAIMED_AT = "orchard.dev/claimed-at"
A_EXPIRES_AT = "orchard.dev/expires-at"
A_LABELS = "orchard.dev/labels"

SANDBOX_SELECTOR = f"{MANAGED_BY}={MANAGED_BY_VALUE},{ROLE}={ROLE_SANDBOX}"
"""Label selector of every sandbox pod (the watch cache's selector)."""

NETWORK_CLASSES = ("none", "allowlist", "internet")
BUNDLE_VOLUME = "orchard-bundle"
RUN_VOLUME = "orchard-run"
TOKEN_VOLUME = "orchard-token"
TOKEN_KEY_FILE = "token.key"
ROLE_SANDBOX_TOKEN = "sandbox-token"
TASK_CONTAINER = "sandbox"
INIT_CONTAINER = "orchard-bundle"

_DNS_LABEL_RE = re.compile(r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$")
_LABEL_VALUE_RE = re.compile(r"^([A-Za-z0-9]([A-Za-z0-9._-]{0,61}[A-Za-z0-9])?)?$")


def label_value(text: str) -> str:
    """``text`` if it is a valid label value, else "" (the annotation keeps the full text)."""
    return text if _LABEL_VALUE_RE.fullmatch(text) else ""


def quantity_cpu(millis: int) -> str:
    return f"{millis}m"


def quantity_bytes(n: int) -> str:
    return str(n)


def _init_script(settings: KubernetesSettings) -> str:
    # busybox sh in the bundle image; set -e so a failed copy fails the pod
    # (init container failure -> the sandbox is FAILED with fault infrastructure).
    return (
        "set -e; "
        f'cp -a {settings.bundle_path_in_image}/. "{settings.mount_path}/"; '
        f'mkdir -p "{settings.run_dir}"; '
        f'cp /orchard-token/{TOKEN_KEY_FILE} "{settings.run_dir}/{TOKEN_KEY_FILE}"; '
        f'printf %s "$ORCHARD_SANDBOX_JSON" > "{settings.run_dir}/sandbox.json"'
    )


def sandbox_pod(
    spec: SandboxSpec,
    settings: KubernetesSettings,
    template: PodTemplate | None = None,
    *,
    tenant: str = "",
    claimed: bool = True,
    created_at: float = 0.0,
    deadline_seconds: int,
) -> Manifest:
    """The pod of sandbox ``spec``; ``claimed=False`` makes a free warm-pool member."""
    tpl = template or settings.default_template
    name = spec.sandbox_id
    if not _DNS_LABEL_RE.fullmatch(name):
        raise BackendError.invalid(f"sandbox id {name!r} is not a valid pod name")
    if tpl.network_class not in NETWORK_CLASSES:
        raise BackendError.invalid(f"unknown network class {tpl.network_class!r}")
    if spec.network_mode != NETWORK_NONE and tpl.network_class == "none":
        raise BackendError.invalid(f"network mode {spec.network_mode!r} needs a network class")
    if deadline_seconds < 1:
        raise BackendError.invalid("the pod deadline must be at least one second")
    image = spec.image or tpl.image or settings.default_image
    resources: dict[str, str] = {
        "cpu": quantity_cpu(spec.cpu_millis),
        "memory": quantity_bytes(spec.memory_bytes),
    }
    if tpl.ephemeral_storage_bytes:
        resources["ephemeral-storage"] = quantity_bytes(tpl.ephemeral_storage_bytes)
    meta_json = json.dumps(
        {"sandbox_id": name, "env": dict(spec.env), "cwd": "/", "init_pid": 0, "memory_cgroup": ""},
        sort_keys=True,
    )
    labels = {
        MANAGED_BY: MANAGED_BY_VALUE,
        ROLE: ROLE_SANDBOX,
        SANDBOX_ID: name,
        POOL: label_value(tpl.name),
        CLAIM: CLAIMED if claimed else CLAIM_FREE,
        NETWORK: tpl.network_class,
    }
    if claimed and label_value(tenant):
        labels[TENANT] = label_value(tenant)
    annotations = {
        A_SPEC: json.dumps(
            {
                "image": image,
                "cpu_millis": spec.cpu_millis,
                "memory_bytes": spec.memory_bytes,
                "pids": spec.pids,
                "network_mode": spec.network_mode,
            },
            sort_keys=True,
        ),
        A_CREATED_AT: f"{created_at:.3f}",
    }
    if claimed:
        annotations[A_TENANT] = tenant
        annotations[A_CLAIMED_AT] = f"{created_at:.3f}"
    pod_security: dict[str, Any] = {"seccompProfile": {"type": "RuntimeDefault"}}
    if tpl.run_as_non_root:
        if tpl.run_as_user is None or tpl.run_as_user <= 0:
            # The uid is needed as fsGroup too: the token Secret must be readable by it.
            raise BackendError.invalid(f"template {tpl.name!r}: run_as_non_root needs run_as_user")
        pod_security["runAsNonRoot"] = True
        pod_security["runAsUser"] = tpl.run_as_user
        pod_security["runAsGroup"] = tpl.run_as_user
        pod_security["fsGroup"] = tpl.run_as_user
    container_security: dict[str, Any] = {
        "allowPrivilegeEscalation": False,
        "privileged": False,
        "capabilities": {"drop": ["ALL"], "add": list(tpl.capabilities_add)},
    }
    pod_spec: dict[str, Any] = {
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "restartPolicy": "Never",
        "activeDeadlineSeconds": deadline_seconds,
        "terminationGracePeriodSeconds": 2,
        "securityContext": pod_security,
        "initContainers": [
            {
                "name": INIT_CONTAINER,
                "image": settings.bundle_image,
                "command": ["/bin/sh", "-c", _init_script(settings)],
                "env": [{"name": "ORCHARD_SANDBOX_JSON", "value": meta_json}],
                # The copy is cheap; small fixed resources keep the pod Guaranteed.
                "resources": {
                    "requests": {"cpu": "100m", "memory": "64Mi"},
                    "limits": {"cpu": "100m", "memory": "64Mi"},
                },
                "securityContext": {
                    "allowPrivilegeEscalation": False,
                    "privileged": False,
                    "readOnlyRootFilesystem": True,
                    "capabilities": {"drop": ["ALL"]},
                },
                "volumeMounts": [
                    {"name": BUNDLE_VOLUME, "mountPath": settings.mount_path},
                    {"name": RUN_VOLUME, "mountPath": settings.run_dir},
                    {"name": TOKEN_VOLUME, "mountPath": "/orchard-token", "readOnly": True},
                ],
            }
        ],
        "containers": [
            {
                "name": TASK_CONTAINER,
                "image": image,
                "command": [f"{settings.mount_path}/bin/orchard-executor"],
                "args": [
                    "--in-sandbox",
                    settings.run_dir,
                    "--listen",
                    f"0.0.0.0:{settings.executor_port}",
                ],
                "env": [{"name": k, "value": v} for k, v in sorted(spec.env.items())],
                "ports": [
                    {"name": "executor", "containerPort": settings.executor_port, "protocol": "TCP"}
                ],
                # The executor's grpc.health.v1 service (a gRPC probe's port is a number).
                # No liveness probe: a task that saturates its own CPU limit may delay
                # the answer, and killing the container would end the sandbox.
                "readinessProbe": {
                    "grpc": {"port": settings.executor_port},
                    "periodSeconds": 1,
                    "failureThreshold": 3,
                },
                "resources": {"requests": resources, "limits": dict(resources)},
                "securityContext": container_security,
                "volumeMounts": [
                    {"name": BUNDLE_VOLUME, "mountPath": settings.mount_path, "readOnly": True},
                    {"name": RUN_VOLUME, "mountPath": settings.run_dir},
                ],
            }
        ],
        "volumes": [
            {"name": BUNDLE_VOLUME, "emptyDir": {"sizeLimit": "512Mi"}},
            {"name": RUN_VOLUME, "emptyDir": {"medium": "Memory", "sizeLimit": "16Mi"}},
            {
                "name": TOKEN_VOLUME,
                "secret": {"secretName": token_secret_name(name), "defaultMode": 0o440},
            },
        ],
    }
    if tpl.runtime_class_name:
        pod_spec["runtimeClassName"] = tpl.runtime_class_name
    if tpl.priority_class_name:
        pod_spec["priorityClassName"] = tpl.priority_class_name
    if tpl.node_selector:
        pod_spec["nodeSelector"] = dict(tpl.node_selector)
    if tpl.tolerations:
        pod_spec["tolerations"] = [dict(t) for t in tpl.tolerations]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": settings.namespace,
            "labels": labels,
            "annotations": annotations,
        },
        "spec": pod_spec,
    }


def token_secret_name(sandbox_id: str) -> str:
    """The sandbox's own token Secret (a pod name is a DNS label, so this is a valid name)."""
    return f"{sandbox_id}-token"


def sandbox_token_secret(sandbox_id: str, namespace: str, token_keys: bytes) -> Manifest:
    """The Secret holding ``sandbox_id``'s own token keys (``tokens.encode_sandbox_keys``)."""
    if not _DNS_LABEL_RE.fullmatch(sandbox_id):
        raise BackendError.invalid(f"sandbox id {sandbox_id!r} is not a valid pod name")
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {
            "name": token_secret_name(sandbox_id),
            "namespace": namespace,
            "labels": {
                MANAGED_BY: MANAGED_BY_VALUE,
                ROLE: ROLE_SANDBOX_TOKEN,
                SANDBOX_ID: sandbox_id,
            },
        },
        "type": "Opaque",
        "data": {TOKEN_KEY_FILE: base64.b64encode(token_keys).decode()},
    }


def owned_by_pod(pod: Manifest) -> Manifest:
    """A merge patch making an object owned by ``pod`` (the garbage collector removes it
    with the pod, however the pod goes)."""
    meta = pod.get("metadata") or {}
    return {
        "metadata": {
            "ownerReferences": [
                {"apiVersion": "v1", "kind": "Pod", "name": meta["name"], "uid": meta["uid"]}
            ]
        }
    }


# ---- NetworkPolicies ---------------------------------------------------------


def network_policy(
    name: str,
    namespace: str,
    pod_selector: Mapping[str, str],
    *,
    ingress: list[Manifest] | None = None,
    egress: list[Manifest] | None = None,
    policy_types: tuple[str, ...] = ("Ingress", "Egress"),
) -> Manifest:
    """A NetworkPolicy; rules left None (with their type listed) deny that direction."""
    spec: dict[str, Any] = {
        "podSelector": {"matchLabels": dict(pod_selector)},
        "policyTypes": list(policy_types),
    }
    if ingress is not None:
        spec["ingress"] = ingress
    if egress is not None:
        spec["egress"] = egress
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": {MANAGED_BY: MANAGED_BY_VALUE},
        },
        "spec": spec,
    }


def sandbox_selector(**extra: str) -> dict[str, str]:
    return {ROLE: ROLE_SANDBOX, **extra}


def default_deny_policy(namespace: str) -> Manifest:
    """No traffic in or out of any sandbox pod unless another policy allows it.

    NetworkPolicies are additive allow-lists, so this one plus allow rules that
    never name sandbox pods as peers is what keeps sandboxes from each other.
    """
    return network_policy("orchard-sandbox-default-deny", namespace, sandbox_selector())


def executor_ingress_policy(
    namespace: str,
    control_namespace: str,
    port: int,
    client_cidrs: tuple[str, ...] = (),
) -> Manifest:
    """Clients reach executors: the control plane's pods and namespaces labelled as clients.

    The sandbox namespace must never carry ``orchard.dev/executor-client``: that
    would let sandboxes reach each other's executors.
    """
    peers: list[Manifest] = [
        {
            "namespaceSelector": {
                "matchLabels": {"kubernetes.io/metadata.name": control_namespace}
            },
            "podSelector": {"matchLabels": {"app.kubernetes.io/part-of": "orchard"}},
        },
        {"namespaceSelector": {"matchLabels": {"orchard.dev/executor-client": "true"}}},
    ]
    peers += [{"ipBlock": {"cidr": cidr}} for cidr in client_cidrs]
    return network_policy(
        "orchard-sandbox-executor-ingress",
        namespace,
        sandbox_selector(),
        ingress=[{"from": peers, "ports": [{"protocol": "TCP", "port": port}]}],
        policy_types=("Ingress",),
    )


def _dns_egress() -> Manifest:
    return {
        "to": [
            {
                "namespaceSelector": {
                    "matchLabels": {"kubernetes.io/metadata.name": "kube-system"}
                },
                "podSelector": {"matchLabels": {"k8s-app": "kube-dns"}},
            }
        ],
        "ports": [{"protocol": "UDP", "port": 53}, {"protocol": "TCP", "port": 53}],
    }


PRIVATE_RANGES = (
    "10.0.0.0/8",
    "172.16.0.0/12",
    "192.168.0.0/16",
    "169.254.0.0/16",
    "100.64.0.0/10",
)


def internet_egress_policy(
    namespace: str, blocked_cidrs: tuple[str, ...] = PRIVATE_RANGES
) -> Manifest:
    """Class ``internet``: any public address and cluster DNS; never private ranges.

    ``blocked_cidrs`` (private ranges, link-local metadata, the pod and service
    CIDRs) keep the sandbox off other pods, nodes and cloud metadata.
    """
    return network_policy(
        "orchard-sandbox-internet-egress",
        namespace,
        sandbox_selector(**{NETWORK: "internet"}),
        egress=[
            {"to": [{"ipBlock": {"cidr": "0.0.0.0/0", "except": list(blocked_cidrs)}}]},
            _dns_egress(),
        ],
        policy_types=("Egress",),
    )


def allowlist_egress_policy(namespace: str, control_namespace: str, proxy_port: int) -> Manifest:
    """Class ``allowlist``: only the egress proxy (which checks names and addresses).

    Per-sandbox CIDR rules are added by the network-policy compiler as further
    policies selecting ``orchard.dev/sandbox-id``.
    """
    return network_policy(
        "orchard-sandbox-allowlist-egress",
        namespace,
        sandbox_selector(**{NETWORK: "allowlist"}),
        egress=[
            {
                "to": [
                    {
                        "namespaceSelector": {
                            "matchLabels": {"kubernetes.io/metadata.name": control_namespace}
                        },
                        "podSelector": {
                            "matchLabels": {"app.kubernetes.io/component": "egress-proxy"}
                        },
                    }
                ],
                "ports": [{"protocol": "TCP", "port": proxy_port}],
            }
        ],
        policy_types=("Egress",),
    )


def sandbox_network_policies(
    settings: KubernetesSettings,
    *,
    proxy_port: int = 3128,
    client_cidrs: tuple[str, ...] = (),
    blocked_cidrs: tuple[str, ...] = PRIVATE_RANGES,
) -> list[Manifest]:
    """Every class-level policy of the sandbox namespace (the chart renders the same)."""
    ns = settings.namespace
    return [
        default_deny_policy(ns),
        executor_ingress_policy(
            ns, settings.control_namespace, settings.executor_port, client_cidrs
        ),
        internet_egress_policy(ns, blocked_cidrs),
        allowlist_egress_policy(ns, settings.control_namespace, proxy_port),
    ]
