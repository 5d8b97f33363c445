"""Revocations reach the sandbox pods: the scheduler tells each pod's executor.

On one node the executor reads ``revocations.json`` itself. A sandbox pod cannot:
it has no such file, its NetworkPolicies let it reach nothing of the control
plane, and a Secret or downward-API volume is refreshed by the kubelet only
about once a minute. So the scheduler, which can reach every executor (the
executor-ingress policy admits the control plane), watches the revocations file
(``KubernetesSettings.revocations_file``, which the chart mounts from the tenants
Secret) and, when a tenant's moment changes, sends every Ready pod of that tenant
a revocation notice (``ExecutorService.Revoke``) signed with that pod's own token
key (``TokenSigner.sign_revocation``). The pod's executor then refuses the
tenant's older tokens from its next call on: within one check interval plus one
call of the scheduler noticing the change.

A push that fails (pod not listening yet, a network hiccup) is logged and retried
at the next check; a pod made after the revocation never needs one (its tokens are
all issued later). The sending itself (signing, bounded concurrency, timeouts,
what was acknowledged) is the scheduler's shared ``revocation_delivery``, which
the local backend's sandboxes with their own executor use too.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from orchard.common.tokens import Revocations, TokenSigner

from ...revocation_delivery import NoticeDelivery, NoticeTarget, PassLoop
from . import manifests as m
from .pod_cache import PodCache
from .pod_status import pod_state


class RevocationPusher:
    """Delivers the tenants' revocations to their sandbox pods' executors."""

    def __init__(
        self,
        revocations_file: Path | None,
        signer: TokenSigner,
        cache: Callable[[], PodCache | None],
        executor_port: int,
        interval_seconds: float,
    ) -> None:
        self._revocations = Revocations(revocations_file)
        self._cache = cache
        self._port = executor_port
        self._delivery = NoticeDelivery(signer)
        self._loop = PassLoop("revocation-push", self.push_once, interval_seconds)

    @property
    def pushed(self) -> int:
        """Notices acknowledged (visible to tests and metrics)."""
        return self._delivery.pushed

    def start(self) -> None:
        if self._revocations.path is not None:
            self._loop.start()

    async def stop(self) -> None:
        await self._loop.stop()

    async def push_once(self) -> int:
        """Send every notice not yet acknowledged; returns how many were acknowledged."""
        table = self._revocations.table()
        cache = self._cache()
        if not table or cache is None:
            return 0
        targets: list[NoticeTarget] = []
        alive: set[str] = set()
        for pod in cache.pods():
            state = pod_state(pod)
            alive.add(state.sandbox_id)
            if not state.tenant or not state.ready or not state.pod_ip or state.deleting:
                continue
            host = f"[{state.pod_ip}]" if ":" in state.pod_ip else state.pod_ip
            targets.append(
                NoticeTarget(
                    state.sandbox_id,
                    state.tenant,
                    f"{host}:{self._port}",
                    _created_at(state.annotations),
                )
            )
        self._delivery.forget(lambda sandbox_id, _tenant: sandbox_id in alive)
        return (await self._delivery.deliver(table, targets)).delivered


def _created_at(annotations: dict[str, str]) -> float:
    try:
        return float(annotations.get(m.A_CREATED_AT, "0"))
    except ValueError:
        return 0.0
