"""ORCHARD_DATA_PLANE / data_plane=: where the SDK sends exec, session and file calls."""

from __future__ import annotations

import pytest

from orchard.client._config import ClientConfig
from orchard.client._errors import ConfigurationError

BASE = {"ORCHARD_ENDPOINT": "gw:1", "ORCHARD_API_KEY": "k"}


def test_direct_is_the_default() -> None:
    config = ClientConfig.resolve(environ=BASE)
    assert (config.data_plane, config.proxied) == ("direct", False)


def test_environment_and_argument() -> None:
    assert ClientConfig.resolve(environ={**BASE, "ORCHARD_DATA_PLANE": "Proxy "}).proxied
    # An explicit argument wins over the environment.
    config = ClientConfig.resolve(
        environ={**BASE, "ORCHARD_DATA_PLANE": "proxy"}, data_plane="direct"
    )
    assert not config.proxied


@pytest.mark.parametrize("bad", ["gateway", "1", "proxy;direct"])
def test_unknown_mode_is_refused_by_name(bad: str) -> None:
    with pytest.raises(ConfigurationError, match="ORCHARD_DATA_PLANE"):
        ClientConfig.resolve(environ={**BASE, "ORCHARD_DATA_PLANE": bad})


def test_cli_flag_sets_the_mode() -> None:
    from orchard.cli import build_parser

    args = build_parser().parse_args(["--data-plane", "proxy", "ls"])
    assert args.data_plane == "proxy"
    with pytest.raises(SystemExit):
        build_parser().parse_args(["--data-plane", "sideways", "ls"])
