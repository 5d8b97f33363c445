"""Every manifest the backend builds, checked against the official Kubernetes OpenAPI schemas."""

from __future__ import annotations

import copy

import pytest
from orchard.scheduler.backends.base import BackendError, SandboxSpec
from orchard.scheduler.backends.kubernetes import KubernetesSettings, PodTemplate
from orchard.scheduler.backends.kubernetes import manifests as m

from .schemas import KUBERNETES_VERSIONS, schema_errors

SPOT = PodTemplate(
    name="spot-py",
    image="python:3.11-slim",
    cpu_millis=2000,
    memory_bytes=8 << 30,
    ephemeral_storage_bytes=10 << 30,
    network_class="internet",
    runtime_class_name="gvisor",
    run_as_non_root=True,
    run_as_user=65532,
    node_selector={"cloud.google.com/gke-spot": "true"},
    tolerations=({"key": "orchard.dev/spot", "operator": "Exists", "effect": "NoSchedule"},),
    priority_class_name="orchard-sandbox",
)
TEMPLATES = [
    PodTemplate(),
    SPOT,
    PodTemplate(name="kata", runtime_class_name="kata", capabilities_add=()),
]


def _pods() -> list[dict[str, object]]:
    settings = KubernetesSettings()
    spec = SandboxSpec(
        sandbox_id="sb-abcdefabcdef", cpu_millis=500, memory_bytes=1 << 30, env={"LANG": "C.UTF-8"}
    )
    pods = []
    for tpl in TEMPLATES:
        for claimed in (True, False):
            pods.append(
                m.sandbox_pod(
                    spec,
                    settings,
                    tpl,
                    tenant="team-a",
                    claimed=claimed,
                    created_at=1.0,
                    deadline_seconds=3900,
                )
            )
    return pods


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_sandbox_pods_match_the_schema(version: str) -> None:
    for pod in _pods():
        assert schema_errors(pod, version) == []


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_network_policies_match_the_schema(version: str) -> None:
    policies = m.sandbox_network_policies(KubernetesSettings(), client_cidrs=("192.0.2.0/24",))
    assert len(policies) == 4
    for policy in policies:
        assert schema_errors(policy, version) == []


def test_the_validator_catches_mistakes() -> None:
    # A check that cannot fail proves nothing: a typo'd field and a wrong type must fail.
    pod = _pods()[0]
    typo = copy.deepcopy(pod)
    typo["spec"]["automountServiceAcountToken"] = False  # type: ignore[index]
    assert schema_errors(typo, "1.33")
    wrong_type = copy.deepcopy(pod)
    wrong_type["spec"]["activeDeadlineSeconds"] = "3900"  # type: ignore[index]
    assert schema_errors(wrong_type, "1.33")


def test_pod_security_and_resources() -> None:
    pod = _pods()[2]  # the spot template, claimed
    spec = pod["spec"]
    assert isinstance(spec, dict)
    assert spec["automountServiceAccountToken"] is False
    assert spec["enableServiceLinks"] is False
    assert spec["restartPolicy"] == "Never"
    assert spec["activeDeadlineSeconds"] == 3900
    assert spec["runtimeClassName"] == "gvisor"
    assert spec["securityContext"] == {
        "seccompProfile": {"type": "RuntimeDefault"},
        "runAsNonRoot": True,
        "runAsUser": 65532,
        "runAsGroup": 65532,
        "fsGroup": 65532,
    }
    task = spec["containers"][0]
    assert task["image"] == "python:3.11-slim"  # unmodified image, only the command is replaced
    assert task["command"] == ["/.orchard/bin/orchard-executor"]
    assert task["resources"]["requests"] == task["resources"]["limits"]
    # Resources come from the request (the scheduler fills them from the template).
    assert task["resources"]["limits"] == {
        "cpu": "500m",
        "memory": str(1 << 30),
        "ephemeral-storage": str(10 << 30),
    }
    sc = task["securityContext"]
    assert sc["allowPrivilegeEscalation"] is False and sc["capabilities"]["drop"] == ["ALL"]
    mounts = {v["mountPath"]: v for v in task["volumeMounts"]}
    assert mounts["/.orchard"]["readOnly"] is True
    # The token Secret is only in the init container, never in the task container.
    assert all(v["name"] != m.TOKEN_VOLUME for v in task["volumeMounts"])
    init = spec["initContainers"][0]
    assert any(v["name"] == m.TOKEN_VOLUME for v in init["volumeMounts"])
    labels = pod["metadata"]["labels"]  # type: ignore[index]
    assert (
        labels[m.POOL] == "spot-py"
        and labels[m.NETWORK] == "internet"
        and labels[m.TENANT] == "team-a"
    )


def test_unsafe_values_are_refused() -> None:
    settings = KubernetesSettings()
    with pytest.raises(BackendError):
        m.sandbox_pod(SandboxSpec(sandbox_id="Bad_Name"), settings, deadline_seconds=10)
    with pytest.raises(BackendError):
        m.sandbox_pod(
            SandboxSpec(sandbox_id="sb-a"),
            settings,
            PodTemplate(network_class="everything"),
            deadline_seconds=10,
        )
    with pytest.raises(BackendError):
        m.sandbox_pod(SandboxSpec(sandbox_id="sb-a"), settings, deadline_seconds=0)
    with pytest.raises(BackendError):
        m.sandbox_pod(
            SandboxSpec(sandbox_id="sb-a"),
            settings,
            PodTemplate(run_as_non_root=True),
            deadline_seconds=10,
        )
    # A tenant name that is not a valid label value is kept only in the annotation.
    pod = m.sandbox_pod(
        SandboxSpec(sandbox_id="sb-abc"), settings, tenant="evil/../x y", deadline_seconds=10
    )
    assert m.TENANT not in pod["metadata"]["labels"]
    assert pod["metadata"]["annotations"][m.A_TENANT] == "evil/../x y"
