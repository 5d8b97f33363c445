"""What a pod's status means for its sandbox: starting, ready, gone wrong (and whose fault).

Kubernetes spreads a pod's fate over phase, reason, conditions and container
states; the scheduler needs one answer: is the sandbox usable, still coming, or
failed, and if failed, was it the task's doing (OOM, the image) or the
platform's (preemption, eviction, node loss, the bundle's init container)?
A trainer drops rollouts hit by infrastructure failures and keeps the rest.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from . import manifests as m

# Waiting reasons that mean the image cannot be had: the client named a bad image.
IMAGE_REASONS = frozenset(
    {"ErrImagePull", "ImagePullBackOff", "InvalidImageName", "ErrImageNeverPull"}
)
# Pod condition DisruptionTarget reasons: the platform took the pod away.
DISRUPTION_REASONS = frozenset(
    {
        "PreemptionByScheduler",
        "DeletionByTaintManager",
        "EvictionByEvictionAPI",
        "TerminationByKubelet",
        "DeletionByPodGC",
    }
)
# Pod status reasons set by the kubelet when it ends a pod.
INFRA_POD_REASONS = frozenset(
    {
        "Evicted",
        "Preempting",
        "Shutdown",
        "NodeShutdown",
        "Terminated",
        "NodeLost",
        "UnexpectedAdmissionError",
        "OutOfcpu",
        "OutOfmemory",
    }
)


@dataclass(frozen=True)
class PodState:
    """One sandbox pod as the scheduler needs to see it."""

    sandbox_id: str
    phase: str
    ready: bool
    pod_ip: str
    resource_version: str
    pool: str
    claimed: bool
    tenant: str
    deleting: bool
    failed: bool
    reason: str
    """ErrorReason-style name when failed: IMAGE_NOT_FOUND, PREEMPTED, EXPIRED, OOM_KILLED, ..."""
    message: str
    client_fault: bool
    """True when the task or the request caused the failure (bad image, OOM), else infrastructure."""
    spec: dict[str, Any] = field(default_factory=dict)
    annotations: dict[str, str] = field(default_factory=dict)
    user_labels: dict[str, str] = field(default_factory=dict)
    start_time: str = ""


def _conditions(status: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c.get("type", ""): c for c in status.get("conditions") or [] if isinstance(c, dict)}


def _container_failure(statuses: list[dict[str, Any]], init: bool) -> tuple[str, str, bool] | None:
    for cs in statuses:
        state = cs.get("state") or {}
        waiting = state.get("waiting") or {}
        terminated = state.get("terminated") or {}
        wreason = waiting.get("reason", "")
        if wreason in IMAGE_REASONS:
            if init:
                return ("BUNDLE_IMAGE_UNAVAILABLE", f"executor bundle image: {wreason}", False)
            return ("IMAGE_NOT_FOUND", f"image {cs.get('image', '')!r}: {wreason}", True)
        if wreason in ("CreateContainerConfigError", "CreateContainerError", "RunContainerError"):
            return ("BACKEND_FAILURE", f"{wreason}: {waiting.get('message', '')}".strip(), False)
        if terminated:
            treason = terminated.get("reason", "")
            code = terminated.get("exitCode", 0)
            if init and code != 0:
                return (
                    "BACKEND_FAILURE",
                    f"the bundle init container failed ({treason or code})",
                    False,
                )
            if not init:
                if treason == "OOMKilled":
                    return ("OOM_KILLED", "the sandbox's executor was OOM-killed", True)
                return (
                    "BACKEND_FAILURE",
                    f"the sandbox's executor exited ({treason or code})",
                    False,
                )
    return None


def pod_state(pod: dict[str, Any]) -> PodState:
    """Classify ``pod`` (an API object as a dict)."""
    meta = pod.get("metadata") or {}
    labels: dict[str, str] = meta.get("labels") or {}
    annotations: dict[str, str] = meta.get("annotations") or {}
    status: dict[str, Any] = pod.get("status") or {}
    phase = status.get("phase", "Pending")
    conds = _conditions(status)
    ready = phase == "Running" and conds.get("Ready", {}).get("status") == "True"
    failure: tuple[str, str, bool] | None = None
    disruption = conds.get("DisruptionTarget", {})
    if disruption.get("status") == "True":
        failure = (
            "PREEMPTED",
            f"the platform took the pod away ({disruption.get('reason', '')})",
            False,
        )
    elif phase == "Failed":
        reason = status.get("reason", "")
        if reason == "DeadlineExceeded":
            failure = ("EXPIRED", "the pod reached its activeDeadlineSeconds (TTL backstop)", False)
        elif reason in INFRA_POD_REASONS:
            failure = ("PREEMPTED", f"{reason}: {status.get('message', '')}".strip(), False)
    if failure is None:
        failure = _container_failure(status.get("initContainerStatuses") or [], True)
    if failure is None:
        failure = _container_failure(status.get("containerStatuses") or [], False)
    if failure is None and phase in ("Failed", "Succeeded"):
        failure = (
            "BACKEND_FAILURE",
            f"the pod ended ({phase} {status.get('reason', '')})".strip(),
            False,
        )
    try:
        spec = json.loads(annotations.get(m.A_SPEC, "{}"))
        user_labels = json.loads(annotations.get(m.A_LABELS, "{}"))
    except ValueError:
        spec, user_labels = {}, {}
    return PodState(
        sandbox_id=labels.get(m.SANDBOX_ID, meta.get("name", "")),
        phase=phase,
        ready=ready and failure is None,
        pod_ip=status.get("podIP", "") or "",
        resource_version=str(meta.get("resourceVersion", "")),
        pool=labels.get(m.POOL, ""),
        claimed=labels.get(m.CLAIM) == m.CLAIMED,
        tenant=annotations.get(m.A_TENANT, ""),
        deleting=bool(meta.get("deletionTimestamp")),
        failed=failure is not None,
        reason=failure[0] if failure else "",
        message=failure[1] if failure else "",
        client_fault=failure[2] if failure else False,
        spec=spec if isinstance(spec, dict) else {},
        annotations=dict(annotations),
        user_labels=user_labels if isinstance(user_labels, dict) else {},
        start_time=status.get("startTime", "") or "",
    )
