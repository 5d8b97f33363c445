"""``Orchard``: the synchronous client, and the resources reached from it.

    from orchard import Orchard

    with Orchard() as client:                     # endpoint and key: arguments, env, local stack
        with client.sandboxes.create(cpu=1) as sb:
            print(sb.exec("echo hi").stdout_text)
        client.pools.hint("py-small", 64, within=30)
        client.rewards.grade(instance, patch)

The client owns the configuration, the credentials, the transport (channels,
interceptors, TLS) and the stubs; every sandbox handle it makes calls through
it. Requests are built by the shared core (``_requests``, ``_core``) and
answers parsed by ``_models``; this face adds only the sync calls.
"""

from __future__ import annotations

import builtins
import contextlib
import time
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
from ._rewards import Rewards
from ._sync import Sandbox
from ._tls import TLS
from ._transport import GrpcTransport, Interceptor, Transport

StubT = TypeVar("StubT")


class Orchard(ClientCore):
    """A connection to one Orchard deployment (sync). Thread-safe; make one and share it.

    ``endpoint`` (``host:port`` of the gateway; ``grpcs://host:port`` for TLS) and ``api_key`` default to
    ``ORCHARD_ENDPOINT`` / ``ORCHARD_API_KEY``, then to the files ``orchard up``
    writes under ``ORCHARD_HOME``. ``data_plane`` is ``"direct"`` (exec and file
    calls straight to the node executor) or ``"proxy"`` (through the gateway);
    default ``ORCHARD_DATA_PLANE`` or direct. ``rewards_endpoint`` defaults to
    ``ORCHARD_REWARDS_ENDPOINT`` or the local stack's, looked up on first use of
    :attr:`rewards`. ``interceptors`` are sync gRPC client interceptors applied
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
        interceptors: Sequence[Interceptor] = (),
        transport: Transport | None = None,
    ) -> None:
        config = resolve_config(endpoint, api_key, data_plane, tls, transport, interceptors)
        self._setup(config, rewards_endpoint, interceptors, transport)

    @classmethod
    def from_config(
        cls,
        config: ClientConfig,
        *,
        rewards_endpoint: str | None = None,
        interceptors: Sequence[Interceptor] = (),
        transport: Transport | None = None,
    ) -> Self:
        """A client for an already resolved :class:`ClientConfig`."""
        client = cls.__new__(cls)
        client._setup(config, rewards_endpoint, interceptors, transport)
        return client

    def _setup(
        self,
        config: ClientConfig,
        rewards_endpoint: str | None,
        interceptors: Sequence[Interceptor],
        transport: Transport | None,
    ) -> None:
        super().__init__(config)
        self.transport: Transport = transport or GrpcTransport(
            credentials=channel_credentials(config.tls),
            interceptors=interceptors,
            options=channel_options(config.tls),
        )
        self._rewards_endpoint = rewards_endpoint
        self._stubs: dict[tuple[str, Callable[[Any], Any]], Any] = {}
        self.sandboxes = Sandboxes(self)
        self.pools = Pools(self)
        self.images = Images(self)
        self._rewards: Rewards | None = None

    @property
    def rewards(self) -> Rewards:
        """The rewards service (grade, judge, score_process, rank) under this client's key."""
        if self._rewards is None:
            self._rewards = Rewards(client=self)
        return self._rewards

    def close(self) -> None:
        """Close the transport's channels; sandboxes made through this client stay."""
        self._stubs.clear()
        self.transport.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def tenant(self) -> TenantInfo:
        """Who this client's key belongs to, its quota, what it uses now, and the server's
        version."""
        with translate_errors():
            msg = self._control().GetTenant(
                sandbox_pb2.GetTenantRequest(), metadata=self.api_metadata
            )
        return tenant_info(msg)

    # ---- stubs (one per address and service, built once) ----------------------

    def _stub(self, address: str, make: Callable[[Any], StubT]) -> StubT:
        key = (address, make)
        stub = self._stubs.get(key)
        if stub is None:
            stub = self._stubs.setdefault(key, make(self.transport.channel(address)))
        return stub  # type: ignore[no-any-return]

    def _control(self) -> sandbox_pb2_grpc.SandboxServiceStub:
        return self._stub(self.config.endpoint, sandbox_pb2_grpc.SandboxServiceStub)

    def _executor(self, address: str) -> executor_pb2_grpc.ExecutorServiceStub:
        return self._stub(address, executor_pb2_grpc.ExecutorServiceStub)

    def _pools(self) -> pools_pb2_grpc.PoolServiceStub:
        return self._stub(self.config.endpoint, pools_pb2_grpc.PoolServiceStub)

    def _rewards_stub(self) -> rewards_pb2_grpc.RewardServiceStub:
        address = self.config.rewards_endpoint(self._rewards_endpoint)
        return self._stub(address, rewards_pb2_grpc.RewardServiceStub)


class Sandboxes:
    """``client.sandboxes``: create, connect to, list and delete sandboxes."""

    def __init__(self, client: Orchard) -> None:
        self._client = client

    def create(
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
        timeout: float | None = 120.0,
        template: str | None = None,
        files: Mapping[str, _requests.FileData] | None = None,
        wait_for_quota: float = 0.0,
        model_endpoint: bool = False,
        tools: _values.Tools | None = None,
    ) -> Sandbox:
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
                    msg = client._control().CreateSandbox(
                        request, metadata=client.api_metadata, timeout=timeout
                    )
                break
            except QuotaExceededError as exc:
                delay = quota_wait.next_delay(exc)
                if delay is None:
                    raise
                time.sleep(delay)
        sandbox = Sandbox(msg, client)
        if files:
            try:
                for path, data in files.items():
                    sandbox.write_file(path, data)
            except BaseException:
                with contextlib.suppress(Exception):
                    sandbox.delete()
                raise
        return sandbox

    def connect(self, sandbox_id: str) -> Sandbox:
        """A handle on an existing sandbox of this tenant."""
        client = self._client
        with translate_errors():
            msg = client._control().GetSandbox(
                _requests.get_request(sandbox_id), metadata=client.api_metadata
            )
        return Sandbox(msg, client)

    def list(self, labels: Mapping[str, str] | None = None) -> builtins.list[SandboxInfo]:
        """The tenant's sandboxes (not deleted), optionally only those carrying ``labels``."""
        client = self._client
        with translate_errors():
            resp = client._control().ListSandboxes(
                _requests.list_request(labels), metadata=client.api_metadata
            )
        return [sandbox_info(s) for s in resp.sandboxes]

    def delete(self, sandbox_id: str) -> None:
        """Delete a sandbox by id (waits until its container is gone); twice is fine."""
        client = self._client
        with translate_errors():
            client._control().DeleteSandbox(
                _requests.delete_request(sandbox_id), metadata=client.api_metadata
            )


class Pools:
    """``client.pools``: warm pools of templates; tell the scheduler what is coming."""

    def __init__(self, client: Orchard) -> None:
        self._client = client

    def list(self) -> builtins.list[PoolInfo]:
        """Every template's pool: sizes, target and hit rate."""
        client = self._client
        with translate_errors():
            resp = client._pools().ListPools(
                pools_pb2.ListPoolsRequest(), metadata=client.api_metadata
            )
        return [pool_info(p) for p in resp.pools]

    def hint(self, template: str, count: int, within: float = 0.0) -> PoolInfo:
        """Tell the scheduler ``count`` sandboxes of ``template`` will be claimed within
        ``within`` seconds: the pool starts growing at once (up to its max), so the batch
        finds warm sandboxes. Returns the pool as it stands after the hint."""
        request = hint_request(template, count, within)
        client = self._client
        with translate_errors():
            resp = client._pools().Hint(request, metadata=client.api_metadata)
        return pool_info(resp.pool)


class Images:
    """``client.images``: the images sandboxes can be made from."""

    def __init__(self, client: Orchard) -> None:
        self._client = client

    def list(self) -> builtins.list[ImageInfo]:
        """The images sandboxes can be made from; one is the default."""
        client = self._client
        with translate_errors():
            resp = client._control().ListImages(
                sandbox_pb2.ListImagesRequest(), metadata=client.api_metadata
            )
        return [image_info(i) for i in resp.images]
