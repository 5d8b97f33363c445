"""The public names are a contract: adding one is a decision, removing one breaks users."""

from __future__ import annotations

import orchard
import orchard.client

EXPECTED = {
    "AsyncSandbox", "AsyncSession", "AuthenticationError", "ClientConfig", "CommandStartError",
    "ConfigurationError", "DeadlineExceededError", "DownloadResult", "ExecEvent", "ExecResult", "ExecStatus", "ImageInfo",
    "ImageNotFoundError", "InfrastructureError", "InvalidRequestError", "OrchardError", "OutputChunk",
    "PathError", "PathEscapeError", "PathNotFoundError", "PermissionDeniedError", "QuotaExceededError",
    "Sandbox", "SandboxError", "SandboxInfo", "SandboxNotFoundError", "SandboxNotReadyError",
    "ServiceUnavailableError", "Session", "SessionError", "SandboxLimitError",
    "NetworkPolicy", "PoolInfo", "GradeReport", "JudgeVerdict", "ProcessReward", "Rewards",
    # The client objects, their resources and the transport seam.
    "Orchard", "AsyncOrchard", "Sandboxes", "AsyncSandboxes", "Pools", "AsyncPools", "Images",
    "AsyncImages", "AsyncRewards", "Transport", "AsyncTransport", "GrpcTransport",
    "AsyncGrpcTransport", "Interceptor", "AsyncInterceptor", "close_default_clients", "TenantInfo",
    "TLS",  # TLS for the client's channels (client/_tls.py)
    # Ports: the forward handles and the refused-connection error (client/_ports.py).
    "PortForward", "AsyncPortForward", "PortNotListeningError",
    # File operations (client/_files.py) and the errors that are also Python built-ins.
    "FileEntry", "PathExistsError", "PathIsADirectoryError", "PathNotADirectoryError",
    # Background processes and terminals (client/_processes.py).
    "Process", "AsyncProcess", "ProcessInfo", "ProcessEvent", "OutputDropped", "ProcessError",
    # create(tools=...) on a node without the tools layer (docs/tools-layer.md).
    "ToolsLayerNotBuiltError",
}  # fmt: skip


def test_exported_names_are_pinned() -> None:
    assert set(orchard.client.__all__) == EXPECTED
    assert set(orchard.__all__) == EXPECTED
    for name in EXPECTED:
        assert getattr(orchard, name) is getattr(orchard.client, name)


def test_every_error_derives_from_the_root() -> None:
    for name in EXPECTED:
        obj = getattr(orchard, name)
        if isinstance(obj, type) and issubclass(obj, Exception):
            assert issubclass(obj, orchard.OrchardError), name
    assert issubclass(orchard.DeadlineExceededError, TimeoutError)
    assert issubclass(orchard.SandboxNotFoundError, orchard.SandboxError)
    assert issubclass(orchard.PathEscapeError, orchard.PathError)
    assert issubclass(orchard.PortNotListeningError, ConnectionRefusedError)
    assert issubclass(orchard.PathNotFoundError, FileNotFoundError)
    assert issubclass(orchard.PathExistsError, FileExistsError)
    assert issubclass(orchard.PathIsADirectoryError, IsADirectoryError)
    assert issubclass(orchard.PathNotADirectoryError, NotADirectoryError)
    assert issubclass(orchard.PermissionDeniedError, PermissionError)
