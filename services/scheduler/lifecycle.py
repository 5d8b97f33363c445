"""SandboxLifecycle: the sandbox state machine over the store and the backend.

    PENDING --backend.create ok--> READY --delete/TTL--> DELETING --> DELETED
       |                             |                      ^
       |                             +--claim--> CLAIMED ---+  (warm pool member)
       +--backend.create failed--> FAILED --delete/TTL------+

A plain create ends READY, owned by its tenant. A warm pool member ends READY
owned by no tenant (``POOL_TENANT``); a claim makes it CLAIMED, owned by the
claimer, in one compare-and-set in the store (``SandboxStore.claim``). A claim
that finds the pool empty creates cold from the template and ends CLAIMED too.

The store is written before every backend call, so a crash at any point leaves
a record that recovery (``recovery.py``) knows how to finish. Backend calls run
in their own tasks and callers await them shielded: a client that gives up
(deadline, cancel) does not cut a create or delete in half.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any, Literal

import grpc
import structlog

from orchard.common.errors import ServiceError, infrastructure, not_found
from orchard.common.layout import NodeLayout
from orchard.common.metrics import observe_phase
from orchard.common.tokens import TokenSigner
from orchard.common.tracing import span

from .backends.base import (
    CLAIMED_ELSEWHERE,
    POOL_STATE,
    REPORT_FAILURES,
    TOOLS_LAYER_NOT_BUILT,
    UPDATE_ENV,
    Backend,
    BackendError,
    BackendSandbox,
    SandboxSpec,
    check_capabilities,
    supports,
)
from .disk_full import disk_full_error, says_disk_full
from .ids import new_sandbox_id
from .network_policies import NetworkPolicyTable, mode_name
from .settings import SchedulerSettings
from .store import (
    LIVE_STATES,
    POOL_TENANT,
    USABLE_STATES,
    DuplicateRequestError,
    SandboxRecord,
    SandboxStore,
    State,
)
from .templates import Template
from .tenant_quota import call_quota
from .validation import ValidatedCreate

log = structlog.get_logger("orchard.scheduler")

# A claimed member that turns out broken (its container died while it waited)
# is thrown away and the next one tried, this many times, before creating cold.
CLAIM_ATTEMPTS = 3

# "hit": adopted from the warm pool; "miss": created cold; "retry": a repeated
# request_id answered with the sandbox the first call got.
ClaimOutcome = Literal["hit", "miss", "retry"]


class SandboxLifecycle:
    def __init__(
        self,
        store: SandboxStore,
        backend: Backend,
        signer: TokenSigner,
        settings: SchedulerSettings,
        clock: Callable[[], float] = time.time,
    ) -> None:
        check_capabilities(backend)
        self.store = store
        self.backend = backend
        self.signer = signer
        self.settings = settings
        self.clock = clock
        # Backend work in flight, by sandbox id; a second caller awaits the same task.
        self._creating: dict[str, asyncio.Task[SandboxRecord]] = {}
        self._deleting: dict[str, asyncio.Task[None]] = {}
        # Full network policies (allowlists, later updates), beside the store.
        self.network_policies = NetworkPolicyTable(NodeLayout(settings.home).state_db)

    # ---- create -------------------------------------------------------------

    async def create(self, tenant: str, req: ValidatedCreate) -> SandboxRecord:
        """Make a sandbox (or return the one this tenant's ``request_id`` already made)."""
        if req.request_id:
            existing = self.store.get_by_request(tenant, req.request_id)
            if existing is not None:
                return await self._settled(existing)
        now = self.clock()
        rec = SandboxRecord(
            id=new_sandbox_id(),
            tenant=tenant,
            request_id=req.request_id,
            image=req.image,
            cpu_millis=req.cpu_millis,
            memory_bytes=req.memory_bytes,
            pids=req.pids,
            network_mode=req.network_mode,
            ttl_seconds=req.ttl_seconds,
            created_at=now,
            expires_at=now + req.ttl_seconds,
            labels=req.labels,
            env=req.env,
            model_endpoint=req.model_endpoint,
            tool_layers=req.tool_layers,
        )
        if req.network.networked:
            self.network_policies.save(rec.id, req.network)
        return await self._insert_and_create(rec, State.READY)

    async def _insert_and_create(self, rec: SandboxRecord, ready_state: State) -> SandboxRecord:
        try:
            self.store.insert(rec)
        except DuplicateRequestError:
            # Another call with the same request_id won the race.
            existing = self.store.get_by_request(rec.tenant, rec.request_id)
            assert existing is not None
            return await self._settled(existing)
        task = asyncio.get_running_loop().create_task(self._create_in_backend(rec, ready_state))
        self._creating[rec.id] = task
        task.add_done_callback(lambda _t: self._creating.pop(rec.id, None))
        return await asyncio.shield(task)

    # ---- templates: pool members and claims -----------------------------------

    def _from_template(self, template: Template, now: float) -> SandboxRecord:
        return SandboxRecord(
            id=new_sandbox_id(),
            tenant=POOL_TENANT,
            template=template.name,
            image=template.image,
            cpu_millis=template.cpu_millis,
            memory_bytes=template.memory_bytes,
            pids=template.pids,
            network_mode=template.network_mode,
            ttl_seconds=template.idle_ttl_seconds,
            created_at=now,
            expires_at=now + template.idle_ttl_seconds,
            env=dict(template.env),
            runtime_class=template.runtime_class,
        )

    def _save_template_network(self, rec: SandboxRecord, template: Template) -> None:
        if template.network.networked:
            self.network_policies.save(rec.id, template.network)

    async def make_pool_member(self, template: Template) -> SandboxRecord:
        """Create one unclaimed READY member of ``template``'s pool (FAILED if the backend fails)."""
        rec = self._from_template(template, self.clock())
        self._save_template_network(rec, template)
        return await self._insert_and_create(rec, State.READY)

    async def claim(
        self, tenant: str, req: ValidatedCreate, template: Template
    ) -> tuple[SandboxRecord, ClaimOutcome]:
        """A CLAIMED sandbox of ``template`` for ``tenant``, and where it came from.

        A retried claim (same ``request_id``) returns the sandbox the first one got.
        """
        if req.request_id:
            existing = self.store.get_by_request(tenant, req.request_id)
            if existing is not None:
                return await self._settled(existing), "retry"
        env_updater = supports(self.backend, UPDATE_ENV)
        pool_state = supports(self.backend, POOL_STATE)
        for _ in range(CLAIM_ATTEMPTS if (env_updater is not None or not req.env) else 0):
            try:
                rec = self.store.claim(
                    template.name,
                    tenant,
                    request_id=req.request_id,
                    labels=req.labels,
                    env=req.env,
                    ttl_seconds=req.ttl_seconds,
                    now=self.clock(),
                )
            except DuplicateRequestError:
                existing = self.store.get_by_request(tenant, req.request_id)
                assert existing is not None
                return await self._settled(existing), "retry"
            if rec is None:
                break
            try:
                if pool_state is not None:
                    await pool_state.claim_member(
                        rec.id, tenant=tenant, ttl_seconds=req.ttl_seconds, labels=req.labels
                    )
                if req.env:
                    assert env_updater is not None
                    await env_updater.update_env(rec.id, req.env)
                return rec, "hit"
            except BackendError as exc:
                if exc.reason == CLAIMED_ELSEWHERE:
                    # Another scheduler replica won the pod: it is theirs now, not broken.
                    self.store.release_request(rec.id)
                    self.store.set_state(rec.id, State.DELETED, exc.message)
                    continue
                await self._discard_broken_member(rec, exc.message)
        now = self.clock()
        cold = replace(
            self._from_template(template, now),
            tenant=tenant,
            request_id=req.request_id,
            labels=req.labels,
            env={**template.env, **req.env},
            ttl_seconds=req.ttl_seconds,
            expires_at=now + req.ttl_seconds,
            claimed_at=now,
        )
        self._save_template_network(cold, template)
        return await self._insert_and_create(cold, State.CLAIMED), "miss"

    async def _discard_broken_member(self, rec: SandboxRecord, why: str) -> None:
        """A claimed member could not take the claim: fail it (freeing its request id) and remove it."""
        log.warning("claimed pool member is broken; discarding", sandbox_id=rec.id, error=why)
        self.store.release_request(rec.id)
        broken = rec.with_state(
            State.FAILED, f"pool member broken at claim: {why}", "infrastructure", "BACKEND_FAILURE"
        )
        self.store.set_state(
            rec.id, broken.state, broken.state_reason, broken.fault, broken.error_reason
        )
        # On failure the record stays DELETING and the reaper retries it.
        with contextlib.suppress(ServiceError):
            await self.remove(replace(broken, request_id=""), "pool member broken at claim")

    async def _settled(self, rec: SandboxRecord) -> SandboxRecord:
        """``rec`` once its create has finished (a retried create gets the final answer)."""
        task = self._creating.get(rec.id)
        if task is not None:
            return await asyncio.shield(task)
        return rec

    async def _create_in_backend(self, rec: SandboxRecord, ready_state: State) -> SandboxRecord:
        logger = log.bind(sandbox_id=rec.id, tenant=rec.tenant)
        started = time.monotonic()
        spec = SandboxSpec(
            sandbox_id=rec.id,
            image=rec.image,
            cpu_millis=rec.cpu_millis,
            memory_bytes=rec.memory_bytes,
            pids=rec.pids,
            env=dict(rec.env),
            network_mode=mode_name(rec.network_mode),
            network=self.network_policies.get(rec.id, rec.network_mode),
            runtime_class=rec.runtime_class,
            tenant=rec.tenant,
            model_endpoint=rec.model_endpoint,
            tool_layers=rec.tool_layers,
        )
        try:
            with span("backend.create", sandbox_id=rec.id, backend=self.backend.name):
                created = await self._backend_create(rec, spec)
        except BackendError as exc:
            fault = "client" if exc.client_fault else "infrastructure"
            logger.warning("create failed", reason=exc.reason, fault=fault, error=exc.message)
            self.store.set_state(rec.id, State.FAILED, exc.message, fault, exc.reason)
            return rec.with_state(State.FAILED, exc.message, fault, exc.reason)
        except Exception as exc:
            logger.exception("create failed unexpectedly")
            message = f"backend failure: {exc}"
            self.store.set_state(rec.id, State.FAILED, message, "infrastructure", "BACKEND_FAILURE")
            return rec.with_state(State.FAILED, message, "infrastructure", "BACKEND_FAILURE")
        if created.executor_address:
            self.store.set_executor_address(rec.id, created.executor_address)
            rec = replace(rec, executor_address=created.executor_address)
        self.store.set_state(rec.id, ready_state)
        observe_phase("create", time.monotonic() - started)
        logger.info(
            "sandbox ready",
            image=rec.image or "(default)",
            template=rec.template,
            seconds=round(time.monotonic() - started, 4),
        )
        return rec.with_state(ready_state)

    async def _backend_create(self, rec: SandboxRecord, spec: SandboxSpec) -> BackendSandbox:
        pool_state = supports(self.backend, POOL_STATE)
        if pool_state is None:
            return await self.backend.create(spec)
        if rec.in_pool:
            return await pool_state.create_pool_member(spec, rec.template)
        return await pool_state.create_owned(
            spec, tenant=rec.tenant, ttl_seconds=rec.ttl_seconds, template=rec.template
        )

    # ---- failures the backend reports --------------------------------------------

    async def sweep_failures(self) -> int:
        """Mark running sandboxes the backend says have failed (preempted, evicted, OOM) FAILED.

        Called by the reaper every pass. A client's sandbox keeps its FAILED record
        (with the backend's reason and fault) until it is deleted or expires; an
        unclaimed pool member, which nobody saw, is removed at once.
        """
        backend = supports(self.backend, REPORT_FAILURES)
        if backend is None:
            return 0
        found = 0
        for rec in self.store.find(states=USABLE_STATES):
            if self.is_busy(rec.id):
                continue
            failure = await backend.failure(rec.id)
            if failure is None:
                continue
            found += 1
            fault = "client" if failure.client_fault else "infrastructure"
            log.warning(
                "sandbox failed in the backend",
                sandbox_id=rec.id,
                reason=failure.reason,
                fault=fault,
                error=failure.message,
            )
            failed = rec.with_state(State.FAILED, failure.message, fault, failure.reason)
            self.store.set_state(rec.id, State.FAILED, failure.message, fault, failure.reason)
            if rec.in_pool:
                with contextlib.suppress(ServiceError):
                    await self.remove(failed, f"pool member failed: {failure.message}")
        return found

    # ---- read ---------------------------------------------------------------

    def get(self, tenant: str, sandbox_id: str) -> SandboxRecord:
        """The tenant's sandbox; NOT_FOUND for unknown ids and for other tenants' sandboxes."""
        rec = self.store.get(sandbox_id)
        if rec is None or rec.tenant != tenant or rec.tenant == POOL_TENANT:
            raise not_found(f"sandbox {sandbox_id!r} not found", "SANDBOX_NOT_FOUND")
        return rec

    def access(self, rec: SandboxRecord) -> tuple[str, str, float, bool]:
        """Executor address, a fresh token for ``rec``, its expiry (unix seconds) and whether
        the executor speaks TLS (only the node executor's setting is known here)."""
        now = self.clock()
        ttl = max(1.0, min(self.settings.token_ttl_seconds, rec.expires_at - now))
        # Bound to the owner, with its exec quota for the executor to enforce.
        token, expiry = self.signer.issue(
            rec.id, ttl, now=now, tenant=rec.tenant, max_execs=call_quota().max_execs,
            created=rec.created_at,
        )  # fmt: skip
        address = rec.executor_address or self.settings.executor_address
        if not address:
            raise infrastructure(
                f"sandbox {rec.id} has no executor address (no node executor is configured "
                "and the backend reported none)"
            )
        tls = not rec.executor_address and self.settings.executor_tls
        return address, token, float(expiry), tls

    # ---- delete -------------------------------------------------------------

    async def delete(self, tenant: str, sandbox_id: str) -> None:
        """Delete the tenant's sandbox; deleting a DELETED one again is a no-op.

        Unless ``settings.delete_waits_for_teardown``, the answer comes once the
        record says DELETING (a SQLite write): runc kill/delete, unmounts and
        cgroup removal continue in the background, bounded by the backend's own
        slots. A teardown that fails leaves the record DELETING and the reaper
        retries it; one cut short by a restart is finished by recovery.
        """
        rec = self.get(tenant, sandbox_id)
        await self.remove(rec, "deleted by client", wait=self.settings.delete_waits_for_teardown)

    async def remove(self, rec: SandboxRecord, why: str, *, wait: bool = True) -> None:
        """Remove ``rec``'s container and mark it DELETED (also used by the reaper).

        With ``wait=False`` it returns once the record is DELETING and the
        teardown has been started.
        """
        if rec.state == State.DELETED:
            return
        creating = self._creating.get(rec.id)
        if creating is not None:
            # Let the create finish first: deleting under a half-made container races it.
            await asyncio.shield(creating)
        task = self._deleting.get(rec.id)
        if task is None:
            if rec.state == State.DELETING and rec.state_reason:
                why = rec.state_reason
            self.store.set_state(rec.id, State.DELETING, why)
            task = asyncio.get_running_loop().create_task(self._delete_in_backend(rec.id, why))
            self._deleting[rec.id] = task
            task.add_done_callback(lambda _t: self._deleting.pop(rec.id, None))
            # Fetch the outcome (logged by _delete_in_backend) when nobody awaits it.
            task.add_done_callback(_teardown_outcome)
        if wait:
            await asyncio.shield(task)

    async def _delete_in_backend(self, sandbox_id: str, why: str) -> None:
        logger = log.bind(sandbox_id=sandbox_id)
        try:
            with span("backend.delete", sandbox_id=sandbox_id, backend=self.backend.name):
                await self.backend.delete(sandbox_id)
        except BackendError as exc:
            logger.error("delete failed; will retry", error=exc.message)
            raise infrastructure(f"deleting sandbox {sandbox_id} failed: {exc.message}") from exc
        self.store.set_state(sandbox_id, State.DELETED, why)
        logger.info("sandbox deleted", why=why)

    async def delete_all(self, why: str) -> None:
        """Delete every live sandbox of every tenant (``orchard up`` on exit)."""
        records = self.store.find(states=LIVE_STATES)
        results = await asyncio.gather(
            *(self.remove(r, why) for r in records), return_exceptions=True
        )
        for rec, result in zip(records, results, strict=True):
            if isinstance(result, BaseException):
                log.error("delete on shutdown failed", sandbox_id=rec.id, error=str(result))

    def is_busy(self, sandbox_id: str) -> bool:
        """Whether a create or delete of this sandbox is in flight."""
        return sandbox_id in self._creating or sandbox_id in self._deleting

    async def wait_idle(self) -> None:
        """Wait for backend work in flight (graceful shutdown)."""
        pending: list[asyncio.Task[Any]] = [*self._creating.values(), *self._deleting.values()]
        if pending:
            await asyncio.gather(*pending, return_exceptions=True)


def _teardown_outcome(task: asyncio.Task[None]) -> None:
    """Retrieve a background teardown's error: it was logged, and the reaper retries it."""
    if not task.cancelled():
        task.exception()


def failed_create_error(rec: SandboxRecord) -> ServiceError:
    """The error a create answers with when its sandbox ended FAILED."""
    message = f"sandbox {rec.id} failed: {rec.state_reason}"
    if says_disk_full(rec.state_reason):
        return disk_full_error(message)
    if rec.error_reason == TOOLS_LAYER_NOT_BUILT:
        return ServiceError(
            grpc.StatusCode.FAILED_PRECONDITION, TOOLS_LAYER_NOT_BUILT, message, "infrastructure"
        )
    if rec.fault == "client":
        if rec.error_reason == "IMAGE_NOT_FOUND":
            return ServiceError(grpc.StatusCode.NOT_FOUND, "IMAGE_NOT_FOUND", message)
        return ServiceError(grpc.StatusCode.INVALID_ARGUMENT, "INVALID_FIELD", message)
    return infrastructure(message)


def lease_end(rec: SandboxRecord, ttl_seconds: int, now: float, max_lifetime: int) -> float:
    """The expiry a KeepAlive of ``ttl_seconds`` asks for, capped at ``max_lifetime`` after creation."""
    return min(now + ttl_seconds, rec.created_at + max_lifetime)
