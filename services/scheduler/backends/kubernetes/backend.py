"""KubernetesBackend: sandboxes as pods, the pods' labels and annotations as the state.

Implements the ``Backend`` contract (create, delete, list, inspect, images; the
capabilities it declares in ``capabilities``) and adds what only a cluster has: warm-pool members and claims across scheduler
replicas (``create_pool_member``, ``claim``), the executor's address at the pod
IP (``executor_address``), the reason a pod failed (``failure``), and the
sandbox NetworkPolicies (``ensure_network_policies``).

Each sandbox pod gets its own token keys (derived for it from each of the node's
key ids) in its own Secret, owned by the pod; the node's keyring stays with the
scheduler (``keyring``), so a key read out of one pod cannot mint tokens for another
sandbox. Revoked tenants' tokens are refused by their pods within about a second of
the scheduler seeing the revocation (``revocation_push``).

Nothing is stored outside the cluster: after a restart ``start()`` lists the
pods and ``recover()`` returns every sandbox with its tenant, pool, claim and
spec, so any replica can rebuild its view.
"""

from __future__ import annotations

import builtins
import contextlib
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import structlog

from orchard.common.tokens import (
    Keyring,
    KeyringFile,
    TokenSigner,
    derive_sandbox_key,
    encode_sandbox_keys,
)

from ..base import (
    CLAIMED_ELSEWHERE,
    CLOSE,
    POOL_STATE,
    PUSHES_REVOCATIONS,
    REPORT_FAILURES,
    UPDATE_NETWORK,
    BackendError,
    BackendSandbox,
    Capability,
    ImageInfo,
    SandboxSpec,
    check_sandbox_id,
)

# A module import (not names): netpolicy.k8s imports this package's manifests.
from ..netpolicy import k8s as netk8s
from ..netpolicy.policy import MODE_ALLOWLIST, MODE_NONE, NetworkPolicySpec
from . import manifests as m
from .api import Conflict, KubeApi, NotFound, build_api_client
from .claims import ClaimStats, claim_from_pool, claim_patch
from .pod_cache import PodCache
from .pod_status import PodState, pod_state
from .revocation_push import RevocationPusher
from .settings import KubernetesSettings, PodTemplate

log = structlog.get_logger("orchard.scheduler.kubernetes")

# Conflicts a claim re-reads and retries on (a 409 is usually just a status update).
CLAIM_RETRIES = 4


class KubernetesBackend:
    name = "kubernetes"
    capabilities: frozenset[Capability[Any]] = frozenset(
        {POOL_STATE, UPDATE_NETWORK, REPORT_FAILURES, CLOSE, PUSHES_REVOCATIONS}
    )

    def __init__(
        self,
        settings: KubernetesSettings,
        api_client: Any = None,
        clock: Callable[[], float] = time.time,
        *,
        keyring: Keyring | KeyringFile,
    ) -> None:
        # No I/O here: the client and the cache are made in start().
        self.settings = settings
        self.keyring = keyring
        """The node's token keys (the scheduler signs with the same): each pod's keys are
        derived from them; they never enter a pod."""
        self._api_client = api_client
        self._clock = clock
        self._api: KubeApi | None = None
        self._cache: PodCache | None = None
        self.claim_stats = ClaimStats()
        self.revocations = RevocationPusher(
            settings.revocations_file,
            TokenSigner(keyring),
            lambda: self._cache,
            settings.executor_port,
            settings.revocation_check_seconds,
        )

    # ---- life -------------------------------------------------------------------

    async def start(self) -> None:
        """Connect, list every sandbox pod and start watching (idempotent)."""
        if self._cache is not None:
            return
        client = self._api_client or build_api_client(self.settings)
        self._api = KubeApi(client, self.settings)
        cache = PodCache(self._api, m.SANDBOX_SELECTOR)
        await cache.start()
        self._cache = cache
        self.revocations.start()

    async def close(self) -> None:
        await self.revocations.stop()
        if self._cache is not None:
            await self._cache.stop()
            self._cache = None

    async def _ready(self) -> tuple[KubeApi, PodCache]:
        await self.start()
        assert self._api is not None and self._cache is not None
        return self._api, self._cache

    @property
    def api(self) -> KubeApi:
        assert self._api is not None, "start() first"
        return self._api

    @property
    def cache(self) -> PodCache:
        assert self._cache is not None, "start() first"
        return self._cache

    # ---- create -------------------------------------------------------------------

    async def create(self, spec: SandboxSpec) -> BackendSandbox:
        """A claimed sandbox pod from the default template; returns once it is Ready."""
        return await self.create_pod(spec, tenant="", ttl_seconds=None)

    async def create_owned(
        self, spec: SandboxSpec, *, tenant: str, ttl_seconds: int, template: str
    ) -> BackendSandbox:
        """A sandbox pod owned by ``tenant`` from the start (a plain create or a cold claim)."""
        return await self.create_pod(
            spec, tenant=tenant, ttl_seconds=ttl_seconds, template=template
        )

    def pod_template(self, name: str, spec: SandboxSpec) -> PodTemplate:
        """The pod template for ``spec``: the configured one of that name, else the default's
        settings under that name (the scheduler's templates.toml names the pools); network
        class and RuntimeClass follow the spec."""
        tpl = self.settings.templates.get(name) if name else None
        if tpl is None:
            tpl = self.settings.default_template
            if name:
                tpl = replace(tpl, name=name)
        runtime = spec.runtime_class
        # "runc"/"injected" are local modes; every pod runs its own executor anyway.
        if runtime and runtime not in ("runc", "injected"):
            tpl = replace(tpl, runtime_class_name=runtime)
        return replace(tpl, network_class=spec.network.mode)

    def _with_proxy_env(self, spec: SandboxSpec) -> SandboxSpec:
        """Class ``allowlist`` reaches names only through the egress proxy: point commands at it."""
        if spec.network.mode != MODE_ALLOWLIST:
            return spec
        url = self.settings.egress_proxy_url
        proxy = {key: url for key in ("http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY")}
        proxy.update({"no_proxy": "localhost,127.0.0.1", "NO_PROXY": "localhost,127.0.0.1"})
        return replace(spec, env={**proxy, **spec.env})

    async def create_pod(
        self,
        spec: SandboxSpec,
        *,
        tenant: str,
        ttl_seconds: int | None,
        template: str = "",
        claimed: bool = True,
    ) -> BackendSandbox:
        check_sandbox_id(spec.sandbox_id)
        if spec.network_mode != spec.network.mode:
            raise BackendError.invalid(
                f"network mode {spec.network_mode!r} does not match the policy's "
                f"{spec.network.mode!r}",
                reason="UNSUPPORTED",
            )
        if spec.tool_layers:
            # A hostPath volume would need the layer built on every node the pod may land
            # on, and an image volume a registry to hold it: neither exists yet
            # (docs/tools-layer.md). Refused, never a pod silently without the tools.
            raise BackendError.invalid(
                f"tools layers ({', '.join(spec.tool_layers)}) are not supported by the "
                "kubernetes backend yet: use the local backend (make tools-layer)",
                reason="UNSUPPORTED",
            )
        api, cache = await self._ready()
        tpl = self.pod_template(template, spec)
        # Compiled before anything exists: a refused allowlist creates nothing.
        egress = netk8s.compile_sandbox(
            spec.sandbox_id, self.settings.namespace, spec.network, self.settings.cluster_cidrs
        )
        spec = self._with_proxy_env(spec)
        now = self._clock()
        if claimed:
            ttl = ttl_seconds or self.settings.unclaimed_lifetime_seconds
            deadline = ttl + self.settings.ttl_backstop_grace_seconds
        else:
            deadline = self.settings.unclaimed_lifetime_seconds
        manifest = m.sandbox_pod(
            spec,
            self.settings,
            tpl,
            tenant=tenant,
            claimed=claimed,
            created_at=now,
            deadline_seconds=deadline,
        )
        if claimed and ttl_seconds:
            manifest["metadata"]["annotations"][m.A_EXPIRES_AT] = f"{now + ttl_seconds:.3f}"
        # The per-sandbox allow rules go first: the class policies deny until they exist.
        for policy in egress:
            await api.apply_network_policy(policy)
        secret = m.sandbox_token_secret(
            spec.sandbox_id, self.settings.namespace, self.sandbox_token_keys(spec.sandbox_id)
        )
        owner: str | None = None
        try:
            made = await api.create_secret(secret)
            owner = ((made.get("metadata") or {}).get("labels") or {}).get(m.SANDBOX_ID)
            if owner != spec.sandbox_id:
                raise BackendError.failure(
                    f"secret {m.token_secret_name(spec.sandbox_id)} exists and is not this "
                    "sandbox's"
                )
            try:
                created = await api.create_pod(manifest)
            except Conflict as exc:
                # A retried create of the same id (the scheduler's create is idempotent):
                # adopt the pod if it is ours, never a stranger's.
                existing = await api.get_pod(spec.sandbox_id)
                labels = ((existing or {}).get("metadata") or {}).get("labels") or {}
                if existing is None or labels.get(m.SANDBOX_ID) != spec.sandbox_id:
                    raise BackendError.failure(
                        f"pod {spec.sandbox_id} exists: {exc.message}"
                    ) from None
                created = existing
            cache.observe(created)
            # Owned by its pod: the garbage collector removes it with the pod, however the
            # pod goes (deleted by hand, evicted, or with this scheduler gone).
            await api.patch_secret(m.token_secret_name(spec.sandbox_id), m.owned_by_pod(created))
        except BaseException:
            if cache.get(spec.sandbox_id) is None and owner == spec.sandbox_id:
                with contextlib.suppress(BackendError):
                    await api.delete_secret(m.token_secret_name(spec.sandbox_id))
            raise
        ready = await self._wait_ready(spec.sandbox_id)
        if spec.network.networked:
            try:
                await self._publish_proxy_entry(spec.sandbox_id, spec.network)
            except BaseException:
                await self._discard(spec.sandbox_id)
                raise
        return ready

    def sandbox_token_keys(self, sandbox_id: str) -> bytes:
        """What the sandbox's executor gets: its own key for each of the node's key ids
        (the node keys themselves never leave the scheduler)."""
        ring = self.keyring.ring()
        keys = {kid: derive_sandbox_key(key, sandbox_id) for kid, key in ring.keys.items()}
        return encode_sandbox_keys(sandbox_id, keys)

    async def create_pool_member(self, spec: SandboxSpec, template: str) -> BackendSandbox:
        """A free (unclaimed) warm-pool pod of ``template``."""
        return await self.create_pod(
            spec, tenant="", ttl_seconds=None, template=template, claimed=False
        )

    async def _wait_ready(self, sandbox_id: str) -> BackendSandbox:
        _api, cache = await self._ready()

        def settled() -> bool:
            pod = cache.get(sandbox_id)
            if pod is None:
                return False
            state = pod_state(pod)
            return state.ready or state.failed

        await cache.wait_for(settled, self.settings.ready_timeout_seconds)
        pod = cache.get(sandbox_id)
        state = pod_state(pod) if pod is not None else None
        if state is not None and state.ready:
            return self._sandbox(state)
        await self._discard(sandbox_id)
        if state is None:
            raise BackendError.failure(f"pod {sandbox_id} disappeared while starting")
        if state.failed:
            raise BackendError(state.reason, state.message, client_fault=state.client_fault)
        raise BackendError.failure(
            f"pod {sandbox_id} was not ready within {self.settings.ready_timeout_seconds:.0f} s "
            f"(phase {state.phase})"
        )

    async def _discard(self, sandbox_id: str) -> None:
        try:
            await self.delete(sandbox_id)
        except BackendError as exc:
            log.warning("could not remove a failed pod", sandbox_id=sandbox_id, error=exc.message)

    # ---- claims ---------------------------------------------------------------------

    async def claim(
        self,
        template: str,
        *,
        tenant: str,
        ttl_seconds: int,
        labels: dict[str, str] | None = None,
    ) -> PodState | None:
        """Adopt a free Ready pod of ``template`` for ``tenant``; None if none is left."""
        api, cache = await self._ready()
        pod = await claim_from_pool(
            api,
            cache,
            m.label_value(template),
            tenant=tenant,
            ttl_seconds=ttl_seconds,
            grace_seconds=self.settings.ttl_backstop_grace_seconds,
            now=self._clock(),
            stats=self.claim_stats,
            labels=labels,
        )
        return pod_state(pod) if pod is not None else None

    # ---- delete, list, inspect ------------------------------------------------------

    async def claim_member(
        self, sandbox_id: str, *, tenant: str, ttl_seconds: int, labels: dict[str, str]
    ) -> None:
        """Make the free pool pod ``sandbox_id`` ``tenant``'s, conditional on its resourceVersion.

        A 409 means the pod changed since it was read (often only its status):
        re-read and retry while it is still free. A pod another replica claimed
        raises ``CLAIMED_ELSEWHERE``; a pod gone or no longer Ready raises a
        backend failure (the scheduler discards the member and tries the next).
        """
        check_sandbox_id(sandbox_id)
        api, cache = await self._ready()
        pod = cache.get(sandbox_id)
        for _ in range(CLAIM_RETRIES):
            if pod is None:
                raise BackendError.failure(f"pool pod {sandbox_id} is gone")
            pod_labels = (pod.get("metadata") or {}).get("labels") or {}
            if pod_labels.get(m.CLAIM) == m.CLAIMED:
                raise BackendError(
                    CLAIMED_ELSEWHERE, f"pool pod {sandbox_id} was claimed by another scheduler"
                )
            state = pod_state(pod)
            if state.failed or state.deleting or not state.ready:
                raise BackendError.failure(
                    f"pool pod {sandbox_id} is not usable ({state.reason or state.phase})"
                )
            patch = claim_patch(
                pod,
                tenant=tenant,
                ttl_seconds=ttl_seconds,
                grace_seconds=self.settings.ttl_backstop_grace_seconds,
                now=self._clock(),
                labels=labels,
            )
            try:
                claimed = await api.patch_pod(sandbox_id, patch)
            except Conflict:
                self.claim_stats.conflicts += 1
                pod = await api.get_pod(sandbox_id)
                continue
            except NotFound:
                cache.forget(sandbox_id)
                raise BackendError.failure(f"pool pod {sandbox_id} is gone") from None
            cache.observe(claimed)
            self.claim_stats.claims += 1
            return
        raise BackendError.failure(f"pool pod {sandbox_id} kept changing; claim not confirmed")

    async def delete(self, sandbox_id: str) -> None:
        check_sandbox_id(sandbox_id)
        api, cache = await self._ready()
        pod = cache.get(sandbox_id)
        network = (((pod or {}).get("metadata") or {}).get("labels") or {}).get(m.NETWORK)
        await api.delete_pod(sandbox_id)
        cache.forget(sandbox_id)
        # The owner reference would remove it too, later; at once is better.
        await api.delete_secret(m.token_secret_name(sandbox_id))
        if network != MODE_NONE:  # networked, or unknown (pod already gone): clean up
            await api.delete_network_policy(netk8s.sandbox_egress_policy_name(sandbox_id))
            await self._publish_proxy_entry(sandbox_id, None)

    async def update_network(self, sandbox_id: str, policy: NetworkPolicySpec) -> None:
        """Give a running sandbox pod a new policy: its class label, its own allow rules
        and its proxy table entry.

        Caveat: a pod created in another class has no ``HTTP(S)_PROXY`` in its
        environment (a running pod's env cannot change); commands moved to
        ``allowlist`` must name the proxy themselves to reach domains.
        """
        check_sandbox_id(sandbox_id)
        api, cache = await self._ready()
        pod = cache.get(sandbox_id)
        state = pod_state(pod) if pod is not None else None
        if state is None or not state.ready:
            raise BackendError("SANDBOX_NOT_READY", f"sandbox {sandbox_id} is not running")
        egress = netk8s.compile_sandbox(
            sandbox_id, self.settings.namespace, policy, self.settings.cluster_cidrs
        )
        for manifest in egress:
            await api.apply_network_policy(manifest)
        cache.observe(
            await api.patch_pod(sandbox_id, {"metadata": {"labels": {m.NETWORK: policy.mode}}})
        )
        if not egress:
            await api.delete_network_policy(netk8s.sandbox_egress_policy_name(sandbox_id))
        await self._publish_proxy_entry(sandbox_id, policy if policy.networked else None)

    async def _publish_proxy_entry(self, sandbox_id: str, policy: NetworkPolicySpec | None) -> None:
        """Set (policy) or drop (None) the sandbox's line in the egress proxy's table."""
        api, cache = await self._ready()
        address = tenant = ""
        if policy is not None:
            pod = cache.get(sandbox_id)
            address = pod_state(pod).pod_ip if pod is not None else ""
            if not address:
                raise BackendError.failure(f"pod {sandbox_id} has no IP for the proxy table")
            # The proxy's per-tenant caps: the full name (annotation), else the label.
            meta = (pod or {}).get("metadata", {})
            tenant = (meta.get("annotations") or {}).get(m.A_TENANT) or (
                meta.get("labels") or {}
            ).get(m.TENANT, "")
        await api.patch_config_map(
            netk8s.PROXY_CONFIGMAP,
            self.settings.control_namespace,
            netk8s.proxy_table_patch(sandbox_id, address, policy, tenant),
            create_if_missing=policy is not None,
        )

    async def list(self) -> builtins.list[BackendSandbox]:
        _api, cache = await self._ready()
        return [self._sandbox(pod_state(p)) for p in cache.pods()]

    async def inspect(self, sandbox_id: str) -> BackendSandbox | None:
        check_sandbox_id(sandbox_id)
        _api, cache = await self._ready()
        pod = cache.get(sandbox_id)
        return self._sandbox(pod_state(pod)) if pod is not None else None

    async def recover(self) -> builtins.list[PodState]:
        """Every sandbox pod, fully described (tenant, pool, claim, spec): state after a restart."""
        _api, cache = await self._ready()
        return [pod_state(p) for p in cache.pods()]

    async def failure(self, sandbox_id: str) -> PodState | None:
        """The pod's state when it failed (preempted, evicted, OOM, ...), else None."""
        _api, cache = await self._ready()
        pod = cache.get(sandbox_id)
        if pod is None:
            return None
        state = pod_state(pod)
        return state if state.failed else None

    def executor_address(self, sandbox_id: str) -> str | None:
        """``pod IP:port`` of the sandbox's executor (the data plane goes straight there)."""
        pod = self.cache.get(sandbox_id)
        if pod is None:
            return None
        return self._address(pod_state(pod)) or None

    async def images(self) -> builtins.list[ImageInfo]:
        """The images the templates name (the registry holds them; sizes are unknown here)."""
        names = {self.settings.default_image: True}
        for tpl in [self.settings.default_template, *self.settings.templates.values()]:
            if tpl.image:
                names.setdefault(tpl.image, False)
        return [ImageInfo(name=n, size_bytes=0, layers=0, is_default=d) for n, d in names.items()]

    # ---- network policies ----------------------------------------------------------

    async def ensure_network_policies(self, **kwargs: Any) -> builtins.list[str]:
        """Create or replace the class-level sandbox NetworkPolicies; returns their names."""
        api, _cache = await self._ready()
        names = []
        for policy in m.sandbox_network_policies(self.settings, **kwargs):
            await api.apply_network_policy(policy)
            names.append(policy["metadata"]["name"])
        return names

    def _sandbox(self, state: PodState) -> BackendSandbox:
        return BackendSandbox(
            sandbox_id=state.sandbox_id,
            running=state.ready,
            init_pid=0,
            executor_address=self._address(state),
        )

    def _address(self, state: PodState) -> str:
        if not state.pod_ip:
            return ""
        host = f"[{state.pod_ip}]" if ":" in state.pod_ip else state.pod_ip
        return f"{host}:{self.settings.executor_port}"
