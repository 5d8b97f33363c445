"""``AsyncOrchard``: the asyncio client, and the resources reached from it.

    from orchard import AsyncOrchard

    async with AsyncOrchard() as client:
        async with await client.sandboxes.create(cpu=1) as sb:
            print((await sb.exec("echo hi")).stdout_text)

The twin of ``_sync_client`` (``Orchard``): the same methods, parameters and
defaults, awaited (``tests/sdk/test_faces.py`` fails on any difference). The
requests and parsing are the shared core's; only the calls differ.
"""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import weakref
from collections.abc import Callable, Mapping, Sequence
from types import TracebackType
from typing import Any, Self, TypeVar

from orchard._proto.orchard.v1 import (
    executor_pb2_grpc,
    pools_pb2,
    pools_pb2_grpc,
    rewards_pb2_grpc,
    sandbox_pb2,
    sandbox_pb2_grpc,
)

from . import _requests, _values
from ._async import AsyncSandbox
from ._config import ClientConfig
from ._core import (
    ClientCore,
    channel_credentials,
    channel_options,
    resolve_config,
    translate_errors,
)
from ._errors import QuotaExceededError
from ._models import ImageInfo, SandboxInfo, TenantInfo, image_info, sandbox_info, tenant_info
from ._network import NetworkPolicy
from ._pools import PoolInfo, hint_request, pool_info
from ._quota_wait import QuotaWait
from ._rewards import AsyncRewards
from ._tls import TLS
from ._transport import AsyncGrpcTransport, AsyncInterceptor, AsyncTransport

StubT = TypeVar("StubT")


class AsyncOrchard(ClientCore):
    """A connection to one Orchard deployment (asyncio); see :class:`Orchard`.

    One client may serve several event loops in turn (its channels are per loop).

    ``endpoint`` (``host:port`` of the gateway; ``grpcs://host:port`` for TLS) and ``api_key`` default to
    ``ORCHARD_ENDPOINT`` / ``ORCHARD_API_KEY``, then to the files ``orchard up``
    writes under ``ORCHARD_HOME``. ``data_plane`` is ``"direct"`` (exec and file
    calls straight to the node executor) or ``"proxy"`` (through the gateway);
    default ``ORCHARD_DATA_PLANE`` or direct. ``rewards_endpoint`` defaults to
    ``ORCHARD_REWARDS_ENDPOINT`` or the local stack's, looked up on first use of
    :attr:`rewards`. ``interceptors`` are grpc.aio client interceptors applied
    to every call (timing, tracing, retries). ``tls`` (an :class:`orchard.TLS`: CA, client certificate,
    server name) turns TLS on; without it a ``grpcs://`` endpoint trusts
    ``ORCHARD_TLS_CA``, the home's ``run/ca.pem`` or the system's roots
    (``_tls``). ``transport`` replaces the gRPC
    wire altogether (``orchard.testing``'s fake); give interceptors and TLS to
    it then, not here.
    """

    def __init__(
        self,
        endpoint: str | None = None,
        api_key: str | None = None,
        *,
        data_plane: str | None = None,
        rewards_endpoint: str | None = None,
        tls: TLS | None = None,
        interceptors: Sequence[AsyncInterceptor] = (),
        transport: AsyncTransport | None = None,
    ) -> None:
        config = resolve_config(endpoint, api_key, data_plane, tls, transport, interceptors)
        self._setup(config, rewards_endpoint, interceptors, transport)

    @classmethod
    def from_config(
        cls,
        config: ClientConfig,
        *,
        rewards_endpoint: str | None = None,
        interceptors: Sequence[AsyncInterceptor] = (),
        transport: AsyncTransport | None = None,
    ) -> Self:
        """A client for an already resolved :class:`ClientConfig`."""
        client = cls.__new__(cls)
        client._setup(config, rewards_endpoint, interceptors, transport)
        return client

    def _setup(
        self,
        config: ClientConfig,
        rewards_endpoint: str | None,
        interceptors: Sequence[AsyncInterceptor],
        transport: AsyncTransport | None,
    ) -> None:
        super().__init__(config)
        self.transport: AsyncTransport = transport or AsyncGrpcTransport(
            credentials=channel_credentials(config.tls),
            interceptors=interceptors,
            options=channel_options(config.tls),
        )
        self._rewards_endpoint = rewards_endpoint
        self._stubs: weakref.WeakKeyDictionary[
            asyncio.AbstractEventLoop, dict[tuple[str, Callable[[Any], Any]], Any]
        ] = weakref.WeakKeyDictionary()
        self.sandboxes = AsyncSandboxes(self)
        self.pools = AsyncPools(self)
        self.images = AsyncImages(self)
        self._rewards: AsyncRewards | None = None

    @property
    def rewards(self) -> AsyncRewards:
        """The rewards service (grade, judge, score_process, rank) under this client's key."""
        if self._rewards is None:
            self._rewards = AsyncRewards(client=self)
        return self._rewards

    async def close(self) -> None:
        """Close this loop's channels; sandboxes made through this client stay."""
        self._stubs.pop(asyncio.get_running_loop(), None)
        await self.transport.close()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    async def tenant(self) -> TenantInfo:
        """Who this client's key belongs to, its quota, what it uses now, and the server's
        version."""
        with translate_errors():
            msg = await self._control().GetTenant(
                sandbox_pb2.GetTenantRequest(), metadata=self.api_metadata
            )
        return tenant_info(msg)

    # ---- stubs (one per loop, address and service, built once) ----------------

    def _stub(self, address: str, make: Callable[[Any], StubT]) -> StubT:
        loop = asyncio.get_running_loop()
        stubs = self._stubs.get(loop)
        if stubs is None:
            stubs = self._stubs[loop] = {}
        key = (address, make)
        stub = stubs.get(key)
        if stub is None:
            stub = stubs[key] = make(self.transport.channel(address))
        return stub  # type: ignore[no-any-return]

    def _control(self) -> sandbox_pb2_grpc.SandboxServiceAsyncStub:
        return self._stub(self.config.endpoint, sandbox_pb2_grpc.SandboxServiceStub)  # type: ignore[return-value]

    def _executor(self, address: str) -> executor_pb2_grpc.ExecutorServiceAsyncStub:
        return self._stub(address, executor_pb2_grpc.ExecutorServiceStub)  # type: ignore[return-value]

    def _pools(self) -> pools_pb2_grpc.PoolServiceAsyncStub:
        return self._stub(self.config.endpoint, pools_pb2_grpc.PoolServiceStub)  # type: ignore[return-value]

    def _rewards_stub(self) -> rewards_pb2_grpc.RewardServiceAsyncStub:
        address = self.config.rewards_endpoint(self._rewards_endpoint)
        return self._stub(address, rewards_pb2_grpc.RewardServiceStub)  # type: ignore[return-value]


class AsyncSandboxes:
    """``client.sandboxes``: create, connect to, list and delete sandboxes."""

    def __init__(self, client: AsyncOrchard) -> None:
        self._client = client

    async def create(
        self,
        image: str | None = None,
        cpu: _values.Cpu | None = None,
        memory: _values.Memory | None = None,
        network: str | NetworkPolicy | None = None,
        ttl: _values.Ttl | None = None,
        labels: Mapping[str, str] | None = None,
        env: Mapping[str, str] | None = None,
        request_id: str | None = None,
        pids: int | None = None,
        timeout: float | None = 120.0,  # noqa: ASYNC109 (the call's deadline)
        template: str | None = None,
        files: Mapping[str, _requests.FileData] | None = None,
        wait_for_quota: float = 0.0,
        model_endpoint: bool = False,
        tools: _values.Tools | None = None,
    ) -> AsyncSandbox:
        """Create a sandbox and wait until it is READY.

        ``cpu`` is in cores (``0.5``, ``2``, or ``"500m"``); ``memory`` is bytes or a
        size string (``"512Mi"``, ``"1Gi"``); ``ttl`` is seconds until the server
        deletes it; ``network`` is ``"none"`` (default), ``"internet"`` or a
        :class:`NetworkPolicy`; ``pids`` caps processes and threads. Unset values
        take the server's defaults. A retried call with the same ``request_id``
        returns the same sandbox. ``timeout`` is the call's deadline in seconds.

        ``template`` claims a warm sandbox of that template (image, resources and
        network come from it; leave them unset); ``env``, ``labels``, ``ttl`` and
        ``files`` (path -> content, written before this returns) apply to the claim.

        ``wait_for_quota`` (seconds): when the tenant is over a quota, keep
        retrying that long, sleeping the server's ``retry-after`` between tries,
        before raising :class:`QuotaExceededError` (0: raise at once).

        ``model_endpoint=True`` gives the sandbox a model endpoint: commands inside reach
        the node's recording model proxy at ``$ORCHARD_MODEL_BASE``
        (``http://127.0.0.1:7711``, also :attr:`SandboxInfo.model_endpoint`), whatever
        the network policy, and nothing else of the node (docs/model-endpoint.md).

        ``tools=True`` mounts the tools layer (the agent harness CLIs: ``codex``,
        ``claude``, ``openclaw``, ``mini``, ``aider`` and ``node`` in
        ``/opt/orchard/tools/bin``) read-only; a list names layers. A node that has not
        built the layer refuses with :class:`ToolsLayerNotBuiltError` naming the build
        command (``make tools-layer``), never a sandbox without it.
        """
        request = _requests.create_request(
            image, cpu, memory, network, ttl, labels, env, request_id, pids, template,
            model_endpoint, tools,
        )  # fmt: skip
        client = self._client
        quota_wait = QuotaWait(wait_for_quota)
        while True:
            try:
                with translate_errors():
                    msg = await client._control().CreateSandbox(
                        request, metadata=client.api_metadata, timeout=timeout
                    )
                break
            except QuotaExceededError as exc:
                delay = quota_wait.next_delay(exc)
                if delay is None:
                    raise
                await asyncio.sleep(delay)
        sandbox = AsyncSandbox(msg, client)
        if files:
            try:
                for path, data in files.items():
                    await sandbox.write_file(path, data)
            except BaseException:
                with contextlib.suppress(Exception):
                    await sandbox.delete()
                raise
        return sandbox

    async def connect(self, sandbox_id: str) -> AsyncSandbox:
        """A handle on an existing sandbox of this tenant."""
        client = self._client
        with translate_errors():
            msg = await client._control().GetSandbox(
                _requests.get_request(sandbox_id), metadata=client.api_metadata
            )
        return AsyncSandbox(msg, client)

    async def list(self, labels: Mapping[str, str] | None = None) -> builtins.list[SandboxInfo]:
        """The tenant's sandboxes (not deleted), optionally only those carrying ``labels``."""
        client = self._client
        with translate_errors():
            resp = await client._control().ListSandboxes(
                _requests.list_request(labels), metadata=client.api_metadata
            )
        return [sandbox_info(s) for s in resp.sandboxes]

    async def delete(self, sandbox_id: str) -> None:
        """Delete a sandbox by id (waits until its container is gone); twice is fine."""
        client = self._client
        with translate_errors():
            await client._control().DeleteSandbox(
                _requests.delete_request(sandbox_id), metadata=client.api_metadata
            )


class AsyncPools:
    """``client.pools``: warm pools of templates; tell the scheduler what is coming."""

    def __init__(self, client: AsyncOrchard) -> None:
        self._client = client

    async def list(self) -> builtins.list[PoolInfo]:
        """Every template's pool: sizes, target and hit rate."""
        client = self._client
        with translate_errors():
            resp = await client._pools().ListPools(
                pools_pb2.ListPoolsRequest(), metadata=client.api_metadata
            )
        return [pool_info(p) for p in resp.pools]

    async def hint(self, template: str, count: int, within: float = 0.0) -> PoolInfo:
        """Tell the scheduler ``count`` sandboxes of ``template`` will be claimed within
        ``within`` seconds: the pool starts growing at once (up to its max), so the batch
        finds warm sandboxes. Returns the pool as it stands after the hint."""
        request = hint_request(template, count, within)
        client = self._client
        with translate_errors():
            resp = await client._pools().Hint(request, metadata=client.api_metadata)
        return pool_info(resp.pool)


class AsyncImages:
    """``client.images``: the images sandboxes can be made from."""

    def __init__(self, client: AsyncOrchard) -> None:
        self._client = client

    async def list(self) -> builtins.list[ImageInfo]:
        """See :meth:`Images.list`."""
        client = self._client
        with translate_errors():
            resp = await client._control().ListImages(
                sandbox_pb2.ListImagesRequest(), metadata=client.api_metadata
            )
        return [image_info(i) for i in resp.images]
