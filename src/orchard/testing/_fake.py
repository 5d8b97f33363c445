"""``FakeOrchard``: a whole Orchard deployment in process, and its transports."""

from __future__ import annotations

import asyncio
import threading
import weakref
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, Self

import grpc

from orchard._proto.orchard.v1 import common_pb2

from . import _control, _executor
from ._aio_channel import AsyncFakeChannel
from ._channel import FakeChannel
from ._router import Router
from ._rpc import Status
from ._sandboxes import SandboxRuntimes
from ._scripts import ExecCall, Handler, Matcher, Scripts
from ._status import Fault, Refusal
from ._world import FakeImage, FakeTemplate, SandboxRecord, World

if TYPE_CHECKING:
    from orchard.client import AsyncOrchard, Orchard

GATEWAY_ADDRESS = "gateway.orchard-fake.invalid:50051"
EXECUTOR_ADDRESS = "executor.orchard-fake.invalid:50052"
DEFAULT_TENANT = "dev"
DEFAULT_API_KEY = "ork_fake_dev_key"


class FakeTransport:
    """The sync transport of a :class:`FakeOrchard` (``Orchard(transport=...)``).

    ``interceptors`` wrap every channel with ``grpc.intercept_channel``, as the
    real ``GrpcTransport`` does.
    """

    def __init__(self, router: Router, interceptors: Sequence[Any] = ()) -> None:
        self._router = router
        self._interceptors = tuple(interceptors)
        self._lock = threading.Lock()
        self._channels: dict[str, grpc.Channel] = {}

    def channel(self, address: str) -> grpc.Channel:
        with self._lock:
            channel = self._channels.get(address)
            if channel is None:
                channel = FakeChannel(self._router, address)
                if self._interceptors:
                    channel = grpc.intercept_channel(channel, *self._interceptors)
                self._channels[address] = channel
            return channel

    def close(self) -> None:
        with self._lock:
            channels = list(self._channels.values())
            self._channels.clear()
        for channel in channels:
            channel.close()


class AsyncFakeTransport:
    """The asyncio transport of a :class:`FakeOrchard` (``AsyncOrchard(transport=...)``).

    Channels are kept per event loop, like the real ``AsyncGrpcTransport``.
    ``interceptors`` (grpc.aio client interceptors) run on every call, as in a
    grpc.aio channel.
    """

    def __init__(self, router: Router, interceptors: Sequence[Any] = ()) -> None:
        self._router = router
        self._interceptors = tuple(interceptors)
        self._channels: weakref.WeakKeyDictionary[
            asyncio.AbstractEventLoop, dict[str, AsyncFakeChannel]
        ] = weakref.WeakKeyDictionary()

    def channel(self, address: str) -> grpc.aio.Channel:
        per_loop = self._channels.setdefault(asyncio.get_running_loop(), {})
        channel = per_loop.get(address)
        if channel is None:
            channel = per_loop[address] = AsyncFakeChannel(
                self._router, address, self._interceptors
            )
        return channel

    async def close(self) -> None:
        for channel in self._channels.pop(asyncio.get_running_loop(), {}).values():
            await channel.close()


class FakeOrchard:
    """An in-process Orchard: control plane, pools and data plane over fake channels.

    ``tenants`` maps tenant names to their API keys (default: tenant ``dev``
    with :attr:`api_key`). ``images`` are the image names it knows (default:
    one default image ``debian``); ``templates`` configure the PoolService.
    ``run_commands=False`` runs nothing on the host: every command must be
    scripted with :meth:`on_exec`. ``base_dir`` is where the sandboxes'
    directories go (default: the system's temp dir). See the package docstring
    for what is and is not isolated. ``tool_layers``: the tools layers this fake node
    "has built" (``create(tools=...)`` asking for another is refused with
    FAILED_PRECONDITION, as a real node refuses; nothing is mounted: commands run on
    the host).
    """

    def __init__(
        self,
        *,
        tenants: Mapping[str, Iterable[str]] | None = None,
        images: Iterable[FakeImage | str] = ("debian",),
        templates: Iterable[FakeTemplate] = (),
        run_commands: bool = True,
        base_dir: str | Path | None = None,
        endpoint: str = GATEWAY_ADDRESS,
        executor_endpoint: str = EXECUTOR_ADDRESS,
        tool_layers: Iterable[str] = (),
    ) -> None:
        keys = {t: list(k) for t, k in (tenants or {DEFAULT_TENANT: [DEFAULT_API_KEY]}).items()}
        image_list = [FakeImage(i) if isinstance(i, str) else i for i in images]
        self.endpoint = endpoint
        self.executor_endpoint = executor_endpoint
        self.api_key = next((k[0] for k in keys.values() if k), "")
        self.world = World(
            keys,
            image_list,
            list(templates),
            executor_endpoint,
            Path(base_dir) if base_dir is not None else None,
        )
        self.world.built_tool_layers = set(tool_layers)
        self.scripts = Scripts()
        self.runtimes = SandboxRuntimes()
        self.router = Router()
        control = _control.register(self.world, self.runtimes)
        data = _executor.register(self.world, self.runtimes, self.scripts, run_commands)
        # The gateway also proxies the data plane (``data_plane="proxy"``).
        self.router.serve(endpoint, *control, *data)
        self.router.serve(executor_endpoint, *data)
        # A fake dropped without close() still kills its commands and removes its
        # directories (at garbage collection or interpreter exit).
        self._finalizer = weakref.finalize(self, _shut_down, self.runtimes, self.world)

    # ---- transports and clients ---------------------------------------------------

    def transport(self, *, interceptors: Sequence[Any] = ()) -> FakeTransport:
        return FakeTransport(self.router, interceptors)

    def async_transport(self, *, interceptors: Sequence[Any] = ()) -> AsyncFakeTransport:
        return AsyncFakeTransport(self.router, interceptors)

    def client(self, *, api_key: str | None = None, **kwargs: Any) -> Orchard:
        """An :class:`orchard.Orchard` wired to this fake (endpoint and key filled in)."""
        from orchard.client import Orchard

        interceptors = kwargs.pop("interceptors", ())
        return Orchard(
            self.endpoint,
            api_key or self.api_key,
            transport=self.transport(interceptors=interceptors),
            **kwargs,
        )

    def async_client(self, *, api_key: str | None = None, **kwargs: Any) -> AsyncOrchard:
        """An :class:`orchard.AsyncOrchard` wired to this fake."""
        from orchard.client import AsyncOrchard

        interceptors = kwargs.pop("interceptors", ())
        return AsyncOrchard(
            self.endpoint,
            api_key or self.api_key,
            transport=self.async_transport(interceptors=interceptors),
            **kwargs,
        )

    # ---- scripting and inspection -----------------------------------------------------

    def on_exec(self, matcher: Matcher, result: Handler, *, times: int | None = None) -> None:
        """Answer commands matching ``matcher`` with ``result`` instead of running them.

        ``matcher``: the exact command text (a str), a compiled regex searched in
        it, or a function of the :class:`ExecCall`. ``result``: a
        :class:`ScriptedResult`, stdout text/bytes, or a function of the call
        returning a ScriptedResult. ``times`` limits how often it answers. The
        newest matching script wins.
        """
        self.scripts.add(matcher, result, times)

    @property
    def exec_calls(self) -> list[ExecCall]:
        """Every command the fake was asked to run (scripted or not), oldest first."""
        return list(self.scripts.calls)

    def sandbox(self, sandbox_id: str) -> SandboxRecord:
        """The fake's record of a sandbox (state, labels, env, network updates ...)."""
        with self.world.lock:
            return self.world.sandboxes[sandbox_id]

    def root(self, sandbox_id: str) -> Path:
        """The host directory serving as ``/`` of the sandbox's file calls."""
        return self.sandbox(sandbox_id).root

    def network_policy(self, sandbox_id: str) -> common_pb2.NetworkPolicy:
        """The last policy set (recorded only: the fake enforces none)."""
        return self.sandbox(sandbox_id).network

    def map_port(self, sandbox_id: str, port: int, address: tuple[str, int]) -> None:
        """Make ``port`` inside the sandbox lead to ``address`` on this machine (a server
        the test runs): ``forward_port`` / ``connect_port`` then reach it. Unmapped ports
        are refused like a port nothing listens on (PORT_NOT_LISTENING)."""
        with self.world.lock:
            self.world.ports[(self.sandbox(sandbox_id).id, port)] = address

    def map_model_endpoint(self, base_url: str) -> None:
        """What sandboxes created with ``model_endpoint=True`` from now on reach: their
        commands (which run on this machine) get ``ORCHARD_MODEL_BASE=base_url`` and
        ``SandboxInfo.model_endpoint`` says it, so a model proxy the test runs (its URL
        without ``/s/...``) stands in for the node's. Unmapped, they get the real node's
        ``http://127.0.0.1:7711``, where nothing listens on the host."""
        with self.world.lock:
            self.world.model_endpoint_base = base_url.rstrip("/")

    def reap(self, sandbox_id: str, why: str = "expired: its ttl passed") -> None:
        """Delete a sandbox as the server would on its own (TTL reaper, node loss):
        the client's next call on it gets SANDBOX_NOT_FOUND."""
        _control.remove_sandbox(self.world, self.runtimes, self.sandbox(sandbox_id), why)

    def fail_next(
        self,
        method: str,
        code: grpc.StatusCode = grpc.StatusCode.UNAVAILABLE,
        *,
        reason: str = "BACKEND_FAILURE",
        fault: Fault = "infrastructure",
        message: str = "injected by FakeOrchard.fail_next",
        times: int | None = 1,
    ) -> None:
        """Answer the next ``times`` calls of ``method`` (``"Run"``, ``"CreateSandbox"``,
        or a full path) with this status and orchard trailers, without running them
        (``times=None``: every call). The default is what the real services send when the
        platform fails (UNAVAILABLE, BACKEND_FAILURE, fault ``infrastructure``): the SDK
        raises ``InfrastructureError``, which trainers drop rather than score."""
        refusal = Refusal(code, reason, message, fault)
        self.router.fail(method, Status(code, message, refusal.trailers()), times)

    def close(self) -> None:
        """Kill every command and session still running and remove every sandbox's directory."""
        self._finalizer()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


def _shut_down(runtimes: SandboxRuntimes, world: World) -> None:
    runtimes.discard_all()
    world.close()
