"""Claiming a warm-pool pod by optimistic concurrency on its resourceVersion.

Any number of scheduler replicas may claim from the same pool at once. Each
claim is a JSON merge patch that carries the ``resourceVersion`` the claimer
saw; the API server applies it only if the pod is still at that version, so of
two claimers of one pod exactly one wins and the other gets 409 Conflict and
tries the next free pod. No lock, no leader: the pod itself is the lock.

The claim also lowers ``activeDeadlineSeconds`` to (pod age + ttl + grace): the
kubelet then ends the pod even if no scheduler is left to reap it.
"""

from __future__ import annotations

import json
import math
import random
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from . import manifests as m
from .api import Conflict, KubeApi, NotFound
from .pod_cache import PodCache
from .pod_status import pod_state


@dataclass
class ClaimStats:
    claims: int = 0
    misses: int = 0
    conflicts: int = 0
    """409s: another claimer took the pod first (each costs one more try)."""


def pod_age_seconds(pod: dict[str, Any], now: float) -> float:
    stamp = (pod.get("status") or {}).get("startTime") or (pod.get("metadata") or {}).get(
        "creationTimestamp"
    )
    if not stamp:
        return 0.0
    try:
        started = datetime.fromisoformat(str(stamp).replace("Z", "+00:00")).timestamp()
    except ValueError:
        return 0.0
    return max(0.0, now - started)


def claim_patch(
    pod: dict[str, Any],
    *,
    tenant: str,
    ttl_seconds: int,
    grace_seconds: int,
    now: float,
    labels: dict[str, str] | None = None,
) -> dict[str, Any]:
    """The conditional patch that turns free pool member ``pod`` into ``tenant``'s sandbox."""
    meta = pod.get("metadata") or {}
    current = int((pod.get("spec") or {}).get("activeDeadlineSeconds") or 0)
    deadline = math.ceil(pod_age_seconds(pod, now) + ttl_seconds + grace_seconds)
    if current:
        # The API server only lets the deadline go down, never up.
        deadline = min(deadline, current)
    pod_labels: dict[str, str] = {m.CLAIM: m.CLAIMED}
    if m.label_value(tenant):
        pod_labels[m.TENANT] = m.label_value(tenant)
    return {
        "metadata": {
            "resourceVersion": meta.get("resourceVersion"),
            "labels": pod_labels,
            "annotations": {
                m.A_TENANT: tenant,
                m.A_CLAIMED_AT: f"{now:.3f}",
                m.A_EXPIRES_AT: f"{now + ttl_seconds:.3f}",
                m.A_LABELS: json.dumps(labels or {}, sort_keys=True),
            },
        },
        "spec": {"activeDeadlineSeconds": max(1, deadline)},
    }


def free_ready_pods(cache: PodCache, pool: str) -> list[dict[str, Any]]:
    """Free, Ready, not-deleting members of ``pool``."""
    found = []
    for pod in cache.pods():
        labels = (pod.get("metadata") or {}).get("labels") or {}
        if labels.get(m.POOL) != pool or labels.get(m.CLAIM) != m.CLAIM_FREE:
            continue
        state = pod_state(pod)
        if state.ready and not state.deleting:
            found.append(pod)
    return found


async def claim_from_pool(
    api: KubeApi,
    cache: PodCache,
    pool: str,
    *,
    tenant: str,
    ttl_seconds: int,
    grace_seconds: int,
    now: float,
    stats: ClaimStats,
    labels: dict[str, str] | None = None,
) -> dict[str, Any] | None:
    """Claim one free member of ``pool``; None when there is none left to win."""
    candidates = free_ready_pods(cache, pool)
    # Replicas start from different places, so they rarely race for the same pod.
    random.shuffle(candidates)
    for pod in candidates:
        name = pod["metadata"]["name"]
        patch = claim_patch(
            pod,
            tenant=tenant,
            ttl_seconds=ttl_seconds,
            grace_seconds=grace_seconds,
            now=now,
            labels=labels,
        )
        try:
            claimed = await api.patch_pod(name, patch)
        except Conflict:
            stats.conflicts += 1
            continue
        except NotFound:
            cache.forget(name)
            continue
        cache.observe(claimed)
        stats.claims += 1
        return claimed
    stats.misses += 1
    return None
