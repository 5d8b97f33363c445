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

Dropped token keys reach the pods the same way: the keyring the scheduler signs
with records each drop (``Keyring.dropped``, written by ``orchard token-key rotate
--drop``), and every Ready pod made before a drop is sent a key-drop notice
(``TokenSigner.sign_key_drop``, signed with a live key id the pod holds), after
which its executor refuses the dropped key's tokens. A pod holding **no** live key
(every key its Secret got is dropped) cannot be told: it is logged as an error on
every pass, not deleted here (known gap: delete such pods, ``kubectl delete pod``;
they can verify no token issued after the drop either).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import structlog

from orchard.common.tokens import Revocations, TokenSigner

from ...revocation_delivery import NoticeDelivery, NoticeTarget, PassLoop
from . import manifests as m
from .pod_cache import PodCache
from .pod_status import pod_state

log = structlog.get_logger("orchard.scheduler.revocations")


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
        self._signer = signer
        self._cache = cache
        self._port = executor_port
        self._delivery = NoticeDelivery(signer)
        self._drops = NoticeDelivery(
            signer,
            sign=lambda t, _moment: signer.sign_key_drop(t.sandbox_id, t.tenant, created=t.created),
            what="key drop",
        )
        self._loop = PassLoop("revocation-push", self.push_once, interval_seconds)
        self._untellable: set[tuple[str, str]] = set()
        """(pod's sandbox id, dropped key id) already logged as not tellable."""

    @property
    def pushed(self) -> int:
        """Notices acknowledged, revocations and key drops (visible to tests and metrics)."""
        return self._delivery.pushed + self._drops.pushed

    def start(self) -> None:
        self._loop.start()  # key drops come from the keyring, which every install has

    async def stop(self) -> None:
        await self._loop.stop()

    async def push_once(self) -> int:
        """Send every notice not yet acknowledged; returns how many were acknowledged."""
        table = self._revocations.table() if self._revocations.path is not None else {}
        ring = self._signer.ring.ring()
        dropped = dict(ring.dropped)
        cache = self._cache()
        if not (table or dropped) or cache is None:
            return 0
        targets: list[NoticeTarget] = []
        drops: list[NoticeTarget] = []
        alive: set[str] = set()
        for pod in cache.pods():
            state = pod_state(pod)
            alive.add(state.sandbox_id)
            if not state.tenant or not state.ready or not state.pod_ip or state.deleting:
                continue
            host = f"[{state.pod_ip}]" if ":" in state.pod_ip else state.pod_ip
            address, created = f"{host}:{self._port}", _created_at(state.annotations)
            targets.append(NoticeTarget(state.sandbox_id, state.tenant, address, created))
            for kid, moment in dropped.items():
                if created >= moment:
                    continue  # made after the drop: its Secret never held that key
                if ring.live_kid_held(created, besides=kid) is None:
                    if (state.sandbox_id, kid) not in self._untellable:
                        self._untellable.add((state.sandbox_id, kid))
                        log.error("a sandbox pod holds only dropped token keys and cannot be "
                                  "told; delete it", sandbox_id=state.sandbox_id, kid=kid)  # fmt: skip
                    continue
                drops.append(NoticeTarget(state.sandbox_id, kid, address, created))
        for delivery in (self._delivery, self._drops):
            delivery.forget(lambda sandbox_id, _about: sandbox_id in alive)
        self._untellable = {k for k in self._untellable if k[0] in alive}
        done = (await self._delivery.deliver(table, targets)).delivered
        return done + (await self._drops.deliver(dropped, drops)).delivered


def _created_at(annotations: dict[str, str]) -> float:
    try:
        return float(annotations.get(m.A_CREATED_AT, "0"))
    except ValueError:
        return 0.0
