"""The Orchard SDK: typed sync and async clients over the gRPC stubs.

``Sandbox`` (sync) and ``AsyncSandbox`` (asyncio) share one core: request
building, response parsing and error mapping are the same functions; the two
faces differ only in how they call. See ``_errors`` for the exception tree.
"""

from ._async import AsyncSandbox, AsyncSession
from ._config import ClientConfig
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
    PathNotFoundError,
    PermissionDeniedError,
    QuotaExceededError,
    SandboxError,
    SandboxLimitError,
    SandboxNotFoundError,
    SandboxNotReadyError,
    ServiceUnavailableError,
    SessionError,
)
from ._models import ExecEvent, ExecResult, ExecStatus, ImageInfo, OutputChunk, SandboxInfo
from ._network import NetworkPolicy
from ._pools import PoolInfo, async_hint, async_list_pools, hint, list_pools
from ._rewards import GradeReport, JudgeVerdict, ProcessReward, Rewards
from ._sync import Sandbox, Session
from ._tar import DownloadResult

__all__ = [
    "AsyncSandbox",
    "AsyncSession",
    "AuthenticationError",
    "ClientConfig",
    "CommandStartError",
    "ConfigurationError",
    "DeadlineExceededError",
    "DownloadResult",
    "ExecEvent",
    "ExecResult",
    "ExecStatus",
    "GradeReport",
    "ImageInfo",
    "ImageNotFoundError",
    "InfrastructureError",
    "InvalidRequestError",
    "JudgeVerdict",
    "NetworkPolicy",
    "OrchardError",
    "OutputChunk",
    "PathError",
    "PathEscapeError",
    "PathNotFoundError",
    "PermissionDeniedError",
    "PoolInfo",
    "ProcessReward",
    "QuotaExceededError",
    "Rewards",
    "Sandbox",
    "SandboxError",
    "SandboxInfo",
    "SandboxLimitError",
    "SandboxNotFoundError",
    "SandboxNotReadyError",
    "ServiceUnavailableError",
    "Session",
    "SessionError",
    "async_hint",
    "async_list_pools",
    "hint",
    "list_pools",
]
