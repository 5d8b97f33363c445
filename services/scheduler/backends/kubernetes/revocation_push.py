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

A push that fails (pod not listening yet, a network hiccup) is retried at the
next check; a pod made after the revocation never needs one (its tokens are all
issued later).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from pathlib import Path

import grpc
import structlog

from orchard._proto.orchard.v1 import executor_pb2, executor_pb2_grpc
from orchard.common.tokens import Revocations, TokenSigner

from . import manifests as m
from .pod_cache import PodCache
from .pod_status import pod_state

log = structlog.get_logger("orchard.scheduler.kubernetes.revocations")

PUSH_TIMEOUT_SECONDS = 3.0
MAX_CONCURRENT_PUSHES = 32


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
        self._interval = interval_seconds
        self._delivered: dict[tuple[str, str], float] = {}
        """(sandbox id, tenant) -> the moment that pod's executor has acknowledged."""
        self._task: asyncio.Task[None] | None = None
        self.pushed = 0
        """Notices acknowledged (visible to tests and metrics)."""

    def start(self) -> None:
        if self._task is None and self._revocations.path is not None:
            self._task = asyncio.create_task(self._run(), name="revocation-push")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def _run(self) -> None:
        while True:
            try:
                await self.push_once()
            except Exception as exc:  # never let one bad pass end the deliveries
                log.warning("revocation push failed; retrying", error=str(exc))
            await asyncio.sleep(self._interval)

    async def push_once(self) -> int:
        """Send every notice not yet acknowledged; returns how many were acknowledged."""
        table = self._revocations.table()
        cache = self._cache()
        if not table or cache is None:
            return 0
        due: list[tuple[str, str, str, float, float]] = []
        alive: set[str] = set()
        for pod in cache.pods():
            state = pod_state(pod)
            alive.add(state.sandbox_id)
            before = table.get(state.tenant) if state.tenant else None
            if before is None or not state.ready or not state.pod_ip or state.deleting:
                continue
            created = _created_at(state.annotations)
            if before <= created:
                continue  # every token of this pod is issued after the moment
            if self._delivered.get((state.sandbox_id, state.tenant), 0.0) >= before:
                continue
            due.append((state.sandbox_id, state.pod_ip, state.tenant, before, created))
        for key in [k for k in self._delivered if k[0] not in alive]:
            del self._delivered[key]
        if not due:
            return 0
        gate = asyncio.Semaphore(MAX_CONCURRENT_PUSHES)

        async def bounded(item: tuple[str, str, str, float, float]) -> bool:
            async with gate:
                return await self._push(*item)

        results = await asyncio.gather(*(bounded(item) for item in due))
        done = sum(results)
        self.pushed += done
        return done

    async def _push(
        self, sandbox_id: str, pod_ip: str, tenant: str, before: float, created: float
    ) -> bool:
        notice = self._signer.sign_revocation(sandbox_id, tenant, before, created=created)
        host = f"[{pod_ip}]" if ":" in pod_ip else pod_ip
        try:
            async with grpc.aio.insecure_channel(f"{host}:{self._port}") as channel:
                stub = executor_pb2_grpc.ExecutorServiceStub(channel)
                await stub.Revoke(
                    executor_pb2.RevokeRequest(sandbox_id=sandbox_id, notice=notice),
                    timeout=PUSH_TIMEOUT_SECONDS,
                )
        except grpc.aio.AioRpcError as exc:
            log.info(
                "revocation not delivered yet",
                sandbox_id=sandbox_id,
                tenant=tenant,
                code=exc.code().name,
                details=exc.details(),
            )
            return False
        self._delivered[(sandbox_id, tenant)] = before
        log.info("revocation delivered", sandbox_id=sandbox_id, tenant=tenant, before=before)
        return True


def _created_at(annotations: dict[str, str]) -> float:
    try:
        return float(annotations.get(m.A_CREATED_AT, "0"))
    except ValueError:
        return 0.0
