"""Lifecycle scenarios shared by the offline suite (fake API server) and the e2e suite (a real cluster).

Each scenario takes a factory that makes a fresh, started ``KubernetesBackend``
(a second call is "the scheduler restarted", or "another replica").
"""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import Awaitable, Callable

from orchard.scheduler.backends.base import SandboxSpec
from orchard.scheduler.backends.kubernetes import KubernetesBackend
from orchard.scheduler.backends.kubernetes import manifests as m

BackendFactory = Callable[[], Awaitable[KubernetesBackend]]


def new_id() -> str:
    return "sb-" + secrets.token_hex(6)


def small_spec(sandbox_id: str, image: str = "") -> SandboxSpec:
    return SandboxSpec(
        sandbox_id=sandbox_id, image=image, cpu_millis=250, memory_bytes=256 << 20, env={"A": "1"}
    )


async def create_list_recover_delete(make: BackendFactory) -> None:
    """Create -> Ready with an address; a restarted backend finds it with tenant and spec; delete."""
    backend = await make()
    sid = new_id()
    try:
        made = await backend.create_pod(small_spec(sid), tenant="team-a", ttl_seconds=600)
        assert made.sandbox_id == sid and made.running
        address = backend.executor_address(sid)
        assert address is not None and address.endswith(f":{backend.settings.executor_port}")
        assert sid in {s.sandbox_id for s in await backend.list()}
        inspected = await backend.inspect(sid)
        assert inspected is not None and inspected.running

        restarted = await make()  # a new scheduler process: only the cluster remembers
        try:
            states = {s.sandbox_id: s for s in await restarted.recover()}
            assert sid in states
            state = states[sid]
            assert state.tenant == "team-a" and state.claimed and state.ready
            assert state.spec["cpu_millis"] == 250 and state.spec["memory_bytes"] == 256 << 20
            assert float(state.annotations[m.A_EXPIRES_AT]) > 0
        finally:
            await restarted.close()
    finally:
        await backend.delete(sid)
        await backend.delete(sid)  # idempotent
    assert await backend.inspect(sid) is None
    gone = await backend.cache.wait_for(lambda: backend.cache.get(sid) is None, 30)
    assert gone
    await backend.close()


async def concurrent_claims_never_share(
    make: BackendFactory, pool: str, members: int, claimers: int
) -> None:
    """``claimers`` claims from 3 replicas at once on ``members`` free pods: each pod won once."""
    replicas = [await make() for _ in range(3)]
    ids = [new_id() for _ in range(members)]
    try:
        await asyncio.gather(*(replicas[0].create_pool_member(small_spec(i), pool) for i in ids))
        for r in replicas:  # every replica's cache sees every Ready member
            assert await r.cache.wait_for(
                lambda r=r: (
                    sum(
                        1
                        for p in r.cache.pods()
                        if p["metadata"]["name"] in ids
                        and p["metadata"]["labels"][m.CLAIM] == m.CLAIM_FREE
                        and p.get("status", {}).get("phase") == "Running"
                    )
                    == members
                ),
                30,
            )
        results = await asyncio.gather(
            *(replicas[k % 3].claim(pool, tenant=f"t{k}", ttl_seconds=300) for k in range(claimers))
        )
        won = [r for r in results if r is not None]
        assert len(won) == min(members, claimers)
        assert len({w.sandbox_id for w in won}) == len(won), "a pod was claimed twice"
        # The cluster agrees: every member is claimed, by the tenant that won it.
        fresh = await make()
        try:
            by_id = {s.sandbox_id: s for s in await fresh.recover()}
            for w in won:
                assert by_id[w.sandbox_id].claimed and by_id[w.sandbox_id].tenant == w.tenant
        finally:
            await fresh.close()
    finally:
        for i in ids:
            await replicas[0].delete(i)
        for r in replicas:
            await r.close()
