"""The Orchard SDK: typed sync and async clients over the gRPC stubs.

The front door is a client object, :class:`Orchard` (sync) or
:class:`AsyncOrchard` (asyncio): it owns the configuration, the credentials and
the transport (channels, interceptors, TLS), and reaches sandboxes
(``client.sandboxes``), warm pools (``client.pools``), images
(``client.images``) and the rewards service (``client.rewards``).
``Sandbox.create(...)`` and the other classmethods are thin wrappers over a
default client built from the environment.

The two faces share one core: request building, response parsing and error
mapping are the same functions; they differ only in how they call. The
transport seam (:class:`Transport` / :class:`AsyncTransport`) is where the
wire is swapped, e.g. for ``orchard.testing``'s in-process fake. See
``_errors`` for the exception tree.
"""

from ._async import AsyncSandbox, AsyncSession
from ._async_client import AsyncImages, AsyncOrchard, AsyncPools, AsyncSandboxes
from ._config import ClientConfig
from ._default import close_default_clients
from ._errors import (
    AuthenticationError,
    CommandStartError,
    ConfigurationError,
    DeadlineExceededError,
    ImageNotFoundError,
    InfrastructureError,
    InvalidRequestError,
    OrchardError,
    PathError,
    PathEscapeError,
    PathExistsError,
    PathIsADirectoryError,
    PathNotADirectoryError,
    PathNotFoundError,
    PermissionDeniedError,
    PortNotListeningError,
    ProcessError,
    QuotaExceededError,
    SandboxError,
    SandboxLimitError,
    SandboxNotFoundError,
    SandboxNotReadyError,
    ServiceUnavailableError,
    SessionError,
    ToolsLayerNotBuiltError,
)
from ._files import FileEntry
from ._models import (
    ExecEvent,
    ExecResult,
    ExecStatus,
    ImageInfo,
    OutputChunk,
    SandboxInfo,
    TenantInfo,
)
from ._network import NetworkPolicy
from ._pools import PoolInfo
from ._ports_async import AsyncPortForward
from ._ports_sync import PortForward
from ._process_async import AsyncProcess
from ._process_sync import Process
from ._processes import OutputDropped, ProcessEvent, ProcessInfo
from ._rewards import AsyncRewards, GradeReport, JudgeVerdict, ProcessReward, Rewards
from ._sync import Sandbox, Session
from ._sync_client import Images, Orchard, Pools, Sandboxes
from ._tar import DownloadResult
from ._tls import TLS
from ._transport import (
    AsyncGrpcTransport,
    AsyncInterceptor,
    AsyncTransport,
    GrpcTransport,
    Interceptor,
    Transport,
)

__all__ = [
    "TLS",
    "AsyncGrpcTransport",
    "AsyncImages",
    "AsyncInterceptor",
    "AsyncOrchard",
    "AsyncPools",
    "AsyncPortForward",
    "AsyncProcess",
    "AsyncRewards",
    "AsyncSandbox",
    "AsyncSandboxes",
    "AsyncSession",
    "AsyncTransport",
    "AuthenticationError",
    "ClientConfig",
    "CommandStartError",
    "ConfigurationError",
    "DeadlineExceededError",
    "DownloadResult",
    "ExecEvent",
    "ExecResult",
    "ExecStatus",
    "FileEntry",
    "GradeReport",
    "GrpcTransport",
    "ImageInfo",
    "ImageNotFoundError",
    "Images",
    "InfrastructureError",
    "Interceptor",
    "InvalidRequestError",
    "JudgeVerdict",
    "NetworkPolicy",
    "Orchard",
    "OrchardError",
    "OutputChunk",
    "OutputDropped",
    "PathError",
    "PathEscapeError",
    "PathExistsError",
    "PathIsADirectoryError",
    "PathNotADirectoryError",
    "PathNotFoundError",
    "PermissionDeniedError",
    "PoolInfo",
    "Pools",
    "PortForward",
    "PortNotListeningError",
    "Process",
    "ProcessError",
    "ProcessEvent",
    "ProcessInfo",
    "ProcessReward",
    "QuotaExceededError",
    "Rewards",
    "Sandbox",
    "SandboxError",
    "SandboxInfo",
    "SandboxLimitError",
    "SandboxNotFoundError",
    "SandboxNotReadyError",
    "Sandboxes",
    "ServiceUnavailableError",
    "Session",
    "SessionError",
    "TenantInfo",
    "ToolsLayerNotBuiltError",
    "Transport",
    "close_default_clients",
]
