"""The adapters' pure parts, without a stack: config parsing and the error maps
(each Orchard error the SDK raises, as the other project's callers catch it)."""

from __future__ import annotations

from pathlib import Path

import pytest
from inspect_ai.util import SandboxUnavailableError
from pydantic import ValidationError
from swerex.exceptions import (
    CommandTimeoutError,
    SessionDoesNotExistError,
    SessionNotInitializedError,
)

import orchard
from orchard.integrations.inspect import OrchardAllowlist, OrchardSandboxConfig
from orchard.integrations.inspect._config import resolve_config
from orchard.integrations.inspect._errors import inspect_error
from orchard.integrations.minisweagent import OrchardEnvironmentConfig
from orchard.integrations.swerex import OrchardDeploymentConfig, OrchardUnavailableError
from orchard.integrations.swerex._errors import swerex_error


def test_inspect_config_from_model_file_and_none(tmp_path: Path) -> None:
    assert resolve_config(None) == OrchardSandboxConfig()
    f = tmp_path / "orchard.yaml"
    f.write_text("image: py\ncpu: 2\nnetwork:\n  domains: [pypi.org]\n  ports: [443]\n")
    cfg = resolve_config(str(f))
    assert (cfg.image, cfg.cpu) == ("py", 2)
    assert cfg.network_policy() == orchard.NetworkPolicy.allowlist(
        ports=[443], domains=["pypi.org"]
    )
    assert OrchardSandboxConfig(network=OrchardAllowlist()).network_policy().mode == "allowlist"
    with pytest.raises(ValueError, match="no such file"):
        resolve_config(str(tmp_path / "missing.yaml"))


@pytest.mark.parametrize(
    "model", [OrchardSandboxConfig, OrchardEnvironmentConfig, OrchardDeploymentConfig]
)
def test_configs_refuse_unknown_fields(model: type) -> None:
    with pytest.raises(ValidationError):
        model(imagee="py")  # a typo must not become a silent default


def _err(
    cls: type[orchard.OrchardError], reason: str = "", fault: str = "client"
) -> orchard.OrchardError:
    return cls("boom", reason=reason, fault=fault)


@pytest.mark.parametrize(
    ("err", "expected"),
    [
        (_err(orchard.PathNotFoundError, "PATH_NOT_FOUND"), FileNotFoundError),
        (_err(orchard.PathError, "IS_A_DIRECTORY"), IsADirectoryError),
        (_err(orchard.PathError, "NOT_A_DIRECTORY"), NotADirectoryError),
        (_err(orchard.PermissionDeniedError), PermissionError),
        (_err(orchard.DeadlineExceededError), TimeoutError),
        (_err(orchard.InfrastructureError, fault="infrastructure"), SandboxUnavailableError),
        (_err(orchard.SandboxNotFoundError, "SANDBOX_NOT_FOUND"), SandboxUnavailableError),
        (_err(orchard.SandboxNotReadyError, "SANDBOX_NOT_READY"), SandboxUnavailableError),
    ],
)
def test_inspect_error_map(err: orchard.OrchardError, expected: type[Exception]) -> None:
    mapped = inspect_error(err, "f.txt")
    assert type(mapped) is expected
    if expected in (FileNotFoundError, IsADirectoryError, NotADirectoryError, PermissionError):
        assert (
            isinstance(mapped, OSError) and mapped.filename == "f.txt"
        )  # Inspect's checks look for it


def test_inspect_leaves_request_errors_alone() -> None:
    err = _err(orchard.InvalidRequestError, "INVALID_FIELD")
    assert inspect_error(err) is err  # the caller's to fix, not "unavailable"


@pytest.mark.parametrize(
    ("err", "expected"),
    [
        (_err(orchard.PathNotFoundError, "PATH_NOT_FOUND"), FileNotFoundError),
        (_err(orchard.PathError, "IS_A_DIRECTORY"), IsADirectoryError),
        (_err(orchard.PermissionDeniedError), PermissionError),
        (_err(orchard.DeadlineExceededError), CommandTimeoutError),
        (_err(orchard.SessionError, "SESSION_NOT_FOUND"), SessionDoesNotExistError),
        (_err(orchard.SessionError, "SESSION_DEAD"), SessionNotInitializedError),
        (_err(orchard.ServiceUnavailableError, fault="infrastructure"), OrchardUnavailableError),
        (_err(orchard.SandboxNotFoundError, "SANDBOX_NOT_FOUND"), OrchardUnavailableError),
    ],
)
def test_swerex_error_map(err: orchard.OrchardError, expected: type[Exception]) -> None:
    assert type(swerex_error(err, "/f")) is expected
    assert isinstance(OrchardUnavailableError("x"), RuntimeError)
