"""Sandbox pods against the Pod Security level the chart enforces on their namespace.

No admission controller runs here, so the checks of the Pod Security Standards
("baseline", https://kubernetes.io/docs/concepts/security/pod-security-standards/)
that a sandbox pod could trip are written out below and run on every pod
variant the backend builds, and on the chart's namespace label.
"""

from __future__ import annotations

from typing import Any

import pytest
from orchard.scheduler.backends.base import SandboxSpec
from orchard.scheduler.backends.kubernetes import KubernetesSettings, PodTemplate
from orchard.scheduler.backends.kubernetes import manifests as m
from orchard.scheduler.backends.netpolicy.policy import build_policy

from .test_helm_chart import render

# Baseline: "Adding additional capabilities beyond those listed below must be disallowed."
BASELINE_CAPABILITIES = frozenset(
    {"AUDIT_WRITE", "CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "MKNOD",
     "NET_BIND_SERVICE", "SETFCAP", "SETGID", "SETPCAP", "SETUID", "SYS_CHROOT"}
)  # fmt: skip
# Restricted allows adding only this one.
RESTRICTED_CAPABILITIES = frozenset({"NET_BIND_SERVICE"})


def baseline_violations(pod: dict[str, Any]) -> list[str]:
    spec = pod["spec"]
    found = []
    for key in ("hostNetwork", "hostPID", "hostIPC"):
        if spec.get(key):
            found.append(f"{key} is set")
    for volume in spec.get("volumes", []):
        if "hostPath" in volume:
            found.append(f"hostPath volume {volume['name']}")
    pod_seccomp = (spec.get("securityContext") or {}).get("seccompProfile", {}).get("type")
    if pod_seccomp == "Unconfined":
        found.append("pod seccomp Unconfined")
    for c in spec.get("initContainers", []) + spec["containers"]:
        sc = c.get("securityContext") or {}
        if sc.get("privileged"):
            found.append(f"{c['name']}: privileged")
        added = set((sc.get("capabilities") or {}).get("add", []))
        if added - BASELINE_CAPABILITIES:
            found.append(f"{c['name']}: adds {sorted(added - BASELINE_CAPABILITIES)}")
        if any(p.get("hostPort") for p in c.get("ports", [])):
            found.append(f"{c['name']}: hostPort")
        if (sc.get("seccompProfile") or {}).get("type") == "Unconfined":
            found.append(f"{c['name']}: seccomp Unconfined")
        if sc.get("procMount") not in (None, "Default"):
            found.append(f"{c['name']}: procMount")
    return found


SETTINGS = KubernetesSettings()
ALLOW = build_policy("allowlist", ["198.51.100.0/24"], [], [])
VARIANTS = {
    "default": (SandboxSpec(sandbox_id="sb-a1"), PodTemplate()),
    "non-root": (
        SandboxSpec(sandbox_id="sb-a2"),
        PodTemplate(run_as_non_root=True, run_as_user=65532),
    ),
    "gvisor-allowlist": (
        SandboxSpec(sandbox_id="sb-a3", network_mode="allowlist", network=ALLOW),
        PodTemplate(runtime_class_name="gvisor", network_class="allowlist"),
    ),
}


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_every_sandbox_pod_passes_baseline(variant: str) -> None:
    spec, template = VARIANTS[variant]
    pod = m.sandbox_pod(spec, SETTINGS, template, deadline_seconds=60)
    assert baseline_violations(pod) == []
    # What "restricted" would refuse, and why the chart does not enforce it:
    # a root task needs CHOWN/SETUID/... to chown files and run commands as users.
    added = set(pod["spec"]["containers"][0]["securityContext"]["capabilities"]["add"])
    assert added - RESTRICTED_CAPABILITIES


def test_a_capability_beyond_baseline_is_caught() -> None:
    spec, _ = VARIANTS["default"]
    pod = m.sandbox_pod(
        spec, SETTINGS, PodTemplate(capabilities_add=("CHOWN", "NET_ADMIN")), deadline_seconds=60
    )
    assert baseline_violations(pod) == ["sandbox: adds ['NET_ADMIN']"]


def test_the_chart_enforces_baseline_on_the_sandbox_namespace() -> None:
    (namespace,) = [d for d in render() if d["kind"] == "Namespace"]
    labels = namespace["metadata"]["labels"]
    assert labels["pod-security.kubernetes.io/enforce"] == "baseline"
