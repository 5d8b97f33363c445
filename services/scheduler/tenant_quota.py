"""The scheduler's part of per-tenant quotas: totals checked at create, exec quota into tokens.

The gateway sends the caller's quota in ``orchard-quota`` metadata with
``orchard-tenant`` (see ``orchard.common.quotas``). :func:`remember_call_quota`
(called by ``service.tenant_of``, the first thing every RPC does) parses it
into a contextvar for the rest of the call, so:

- :func:`check_create_quota` refuses a create that would take the tenant over
  ``max_sandboxes``, ``max_cpu_millis`` or ``max_memory_bytes`` (counting its
  PENDING, READY and CLAIMED sandboxes: the ones that hold or are about to
  hold a container). It runs in the same event-loop step as the insert of
  the new record (no ``await`` in between), so concurrent creates cannot all
  pass the check and overshoot together.
- :func:`call_quota` gives ``lifecycle.access`` the tenant's ``max_execs`` to
  sign into the data-plane token, which is how the executor learns it.

A call without ``orchard-quota`` (tests that call the scheduler directly) has
no limits: the scheduler is internal, only the gateway's certificate is admitted
(mutual TLS, ``callers.py``), so no other caller can send one or leave it out.
"""

from __future__ import annotations

from collections.abc import Iterable
from contextvars import ContextVar
from typing import Any

from orchard.common.errors import invalid, quota_exceeded
from orchard.common.metrics import count_quota_rejection
from orchard.common.quotas import QUOTA_KEY, Quota, QuotaConfigError

from .store import SandboxStore, State

_CALL_QUOTA: ContextVar[Quota] = ContextVar("orchard_call_quota", default=Quota())  # noqa: B039 (frozen)
COUNTED_STATES = (State.PENDING, State.READY, State.CLAIMED)
# How long a client over a totals quota should wait before trying again: a
# sandbox is freed by a delete or a TTL, which the scheduler cannot predict;
# a short hint keeps a waiting client responsive without hammering.
TOTALS_RETRY_AFTER_SECONDS = 1.0


def remember_call_quota(metadata: Iterable[Any] | None) -> Quota:
    """Parse the gateway's ``orchard-quota`` for this call (INVALID_ARGUMENT if malformed)."""
    quota = Quota()
    for key, value in metadata or ():
        if key == QUOTA_KEY and isinstance(value, str):
            try:
                quota = Quota.from_metadata(value)
            except QuotaConfigError as exc:
                raise invalid(f"malformed {QUOTA_KEY} metadata: {exc}") from None
            break
    _CALL_QUOTA.set(quota)
    return quota


def call_quota() -> Quota:
    """The quota of the tenant this call is for (unlimited if none was sent)."""
    return _CALL_QUOTA.get()


def check_create_quota(
    store: SandboxStore, tenant: str, cpu_millis: int, memory_bytes: int, request_id: str = ""
) -> None:
    """RESOURCE_EXHAUSTED (with ``retry-after``) if one more sandbox would exceed the tenant's totals."""
    quota = call_quota()
    if not (quota.max_sandboxes or quota.max_cpu_millis or quota.max_memory_bytes):
        return
    if request_id and store.get_by_request(tenant, request_id) is not None:
        return  # a retried create returns the sandbox it already made: nothing new is taken
    live, cpu, memory = store.usage(tenant, COUNTED_STATES)
    over: list[tuple[str, str]] = []
    if quota.max_sandboxes and live + 1 > quota.max_sandboxes:
        over.append(("max_sandboxes", f"{live} of {quota.max_sandboxes} sandboxes in use"))
    if quota.max_cpu_millis and cpu + cpu_millis > quota.max_cpu_millis:
        over.append(
            ("max_cpu_millis", f"{cpu}m + {cpu_millis}m cpu > {quota.max_cpu_millis}m allowed")
        )
    if quota.max_memory_bytes and memory + memory_bytes > quota.max_memory_bytes:
        over.append(
            (
                "max_memory_bytes",
                f"{memory} + {memory_bytes} bytes of memory > {quota.max_memory_bytes} allowed",
            )
        )
    if over:
        for name, _ in over:
            count_quota_rejection("scheduler", tenant, name)
        raise quota_exceeded(
            f"tenant {tenant!r} is over its quota: " + "; ".join(text for _, text in over),
            retry_after=TOTALS_RETRY_AFTER_SECONDS,
        )
