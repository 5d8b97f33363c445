"""Endpoint and key resolution: arguments, then environment, then the local stack's files."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchard import ClientConfig, ConfigurationError


def test_arguments_win(tmp_path: Path) -> None:
    env = {"ORCHARD_ENDPOINT": "env:1", "ORCHARD_API_KEY": "envkey", "ORCHARD_HOME": str(tmp_path)}
    assert ClientConfig.resolve("arg:1", "argkey", environ=env) == ClientConfig("arg:1", "argkey")


def test_environment_then_files(tmp_path: Path) -> None:
    env = {"ORCHARD_ENDPOINT": "env:1", "ORCHARD_API_KEY": "envkey", "ORCHARD_HOME": str(tmp_path)}
    assert ClientConfig.resolve(environ=env) == ClientConfig("env:1", "envkey")
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "gateway.addr").write_text("127.0.0.1:5555\n")
    (tmp_path / "dev-api-key").write_text("ork_dev\n")
    assert ClientConfig.resolve(environ={"ORCHARD_HOME": str(tmp_path)}) == ClientConfig(
        "127.0.0.1:5555", "ork_dev"
    )


def test_missing_configuration_says_what_to_do(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match="ORCHARD_ENDPOINT"):
        ClientConfig.resolve(environ={"ORCHARD_HOME": str(tmp_path)})
    with pytest.raises(ConfigurationError, match="ORCHARD_API_KEY"):
        ClientConfig.resolve(environ={"ORCHARD_HOME": str(tmp_path), "ORCHARD_ENDPOINT": "x:1"})
