"""The CLI reads what an extra holds from the installed metadata (pyproject.toml's lists)."""

from __future__ import annotations

import importlib.metadata
import re

import pytest

from orchard.cli import _extras
from orchard.client import ConfigurationError

from .venvs import PYPROJECT


def _names(lines: list[str]) -> list[str]:
    return [re.split(r"[\s<>=!~\[;]", line, maxsplit=1)[0] for line in lines]


@pytest.mark.parametrize("extra", sorted(PYPROJECT["project"]["optional-dependencies"]))
def test_each_extra_is_read_as_pyproject_writes_it(extra: str) -> None:
    requires = importlib.metadata.requires("orchard-env") or []
    expected = _names(PYPROJECT["project"]["optional-dependencies"][extra])
    assert _extras.extra_requirements(extra, requires) == expected


def test_nothing_is_missing_in_the_dev_venv() -> None:
    assert _extras.missing(("server", "rewards", "kubernetes")) == []
    _extras.require("orchard up", ("server", "rewards"))


def test_a_missing_distribution_is_named_with_the_pip_command(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    real = importlib.metadata.distribution

    def without_structlog(name: str) -> importlib.metadata.Distribution:
        if name == "structlog":
            raise importlib.metadata.PackageNotFoundError(name)
        return real(name)

    monkeypatch.setattr(importlib.metadata, "distribution", without_structlog)
    with pytest.raises(ConfigurationError) as caught:
        _extras.require("orchard up", ("server", "rewards"))
    assert caught.value.message == (
        "orchard up runs the services, which need more than the SDK: "
        "pip install 'orchard-env[server,rewards]' (missing: structlog)"
    )


def test_an_unreadable_requirement_is_an_error_not_skipped() -> None:
    with pytest.raises(ConfigurationError):
        _extras.extra_requirements("server", ['; extra == "server"'])
