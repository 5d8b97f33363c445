"""The sync and async faces cannot drift: same public methods, parameters and defaults.

Each pair below is written twice (once with ``await``); this test is what keeps
them one API. A method on one face only, a renamed or reordered parameter, a
different default, or an async method that is not awaitable fails here.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import pytest

import orchard

PAIRS = [
    (orchard.Orchard, orchard.AsyncOrchard),
    (orchard.Sandboxes, orchard.AsyncSandboxes),
    (orchard.Pools, orchard.AsyncPools),
    (orchard.Images, orchard.AsyncImages),
    (orchard.Rewards, orchard.AsyncRewards),
    (orchard.Sandbox, orchard.AsyncSandbox),
    (orchard.Session, orchard.AsyncSession),
    (orchard.Process, orchard.AsyncProcess),
    (orchard.GrpcTransport, orchard.AsyncGrpcTransport),
    (orchard.PortForward, orchard.AsyncPortForward),
]
# The context-manager protocols are each face's own spelling of one thing.
SPELLINGS = {"__aenter__": "__enter__", "__aexit__": "__exit__"}
# Sync-only conveniences with a reason (none today: add one only with its reason).
SYNC_ONLY: dict[str, str] = {}


def public_members(cls: type) -> dict[str, Any]:
    members = {}
    for name, value in inspect.getmembers(cls):
        if name.startswith("_") and name not in ("__init__", *SPELLINGS, *SPELLINGS.values()):
            continue
        if name in ("__init__",) and value is object.__init__:
            continue
        if not (callable(value) or isinstance(inspect.getattr_static(cls, name), property)):
            continue
        members[SPELLINGS.get(name, name)] = value
    return members


def shape(fn: Callable[..., Any]) -> list[tuple[str, Any, Any]]:
    """(name, kind, default) of every parameter."""
    return [(p.name, p.kind, p.default) for p in inspect.signature(fn).parameters.values()]


@pytest.mark.parametrize("sync_cls, async_cls", PAIRS, ids=lambda c: c.__name__)
def test_same_public_methods(sync_cls: type, async_cls: type) -> None:
    sync_names = set(public_members(sync_cls)) - set(SYNC_ONLY)
    async_names = set(public_members(async_cls))
    assert sync_names == async_names, {
        "only sync": sorted(sync_names - async_names),
        "only async": sorted(async_names - sync_names),
    }


@pytest.mark.parametrize("sync_cls, async_cls", PAIRS, ids=lambda c: c.__name__)
def test_same_parameters_and_defaults(sync_cls: type, async_cls: type) -> None:
    sync_members = public_members(sync_cls)
    async_members = public_members(async_cls)
    for name, sync_fn in sync_members.items():
        if name in SYNC_ONLY:
            continue
        if isinstance(inspect.getattr_static(sync_cls, name), property):
            continue
        assert shape(sync_fn) == shape(async_members[name]), f"{sync_cls.__name__}.{name}"


@pytest.mark.parametrize("sync_cls, async_cls", PAIRS, ids=lambda c: c.__name__)
def test_async_methods_are_awaitable_where_the_sync_ones_do_io(
    sync_cls: type, async_cls: type
) -> None:
    """What the sync face does on the wire, the async face awaits (or iterates with
    ``async for``); pure helpers stay plain functions on both."""
    async_members = public_members(async_cls)
    for name, sync_fn in public_members(sync_cls).items():
        if name in SYNC_ONLY or name == "__init__":
            continue
        if isinstance(inspect.getattr_static(sync_cls, name), property):
            continue
        async_fn = async_members[name]
        if async_fn is sync_fn:
            continue  # one function of the shared core, no I/O (e.g. data_plane_address)
        if inspect.isgeneratorfunction(sync_fn):
            assert inspect.isasyncgenfunction(async_fn), f"{async_cls.__name__}.{name}"
        elif name in ("channel", "from_config"):
            # channel(): an async transport hands out a channel without awaiting;
            # from_config(): a constructor.
            assert not inspect.iscoroutinefunction(async_fn), f"{async_cls.__name__}.{name}"
        else:
            assert inspect.iscoroutinefunction(async_fn) or inspect.isasyncgenfunction(async_fn), (
                f"{async_cls.__name__}.{name} is not awaitable"
            )


def test_the_check_sees_a_difference() -> None:
    """The comparison itself can fail: two classes that differ by one default differ."""

    class A:
        def f(self, x: int = 1) -> None: ...

    class B:
        async def f(self, x: int = 2) -> None: ...

    assert shape(public_members(A)["f"]) != shape(public_members(B)["f"])
