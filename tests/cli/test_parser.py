"""The CLI's parsers without a stack: global flags anywhere, ``rm``'s usage refusals.

Pure argparse and the refusals ``rm`` makes before it builds a client, so no
server is involved; what the commands do against a real stack is in
``test_cli_stack.py``.
"""

from __future__ import annotations

import pytest

from orchard.cli import _connect, build_parser, main, parse


@pytest.mark.parametrize(
    "argv",
    [
        ["--api-key", "K", "--endpoint", "h:1", "ls"],
        ["ls", "--api-key", "K", "--endpoint", "h:1"],
        ["--api-key", "K", "ls", "--endpoint", "h:1"],
        ["image", "--api-key", "K", "ls", "--endpoint", "h:1"],
        ["pool", "ls", "--endpoint", "h:1", "--api-key", "K"],
    ],
)
def test_global_flags_before_or_after_the_subcommand(argv: list[str]) -> None:
    args = parse(build_parser(), argv)
    assert (args.api_key, args.endpoint) == ("K", "h:1")


def test_a_flag_after_the_subcommand_overrides_the_one_before() -> None:
    args = parse(build_parser(), ["--api-key", "first", "ls", "--api-key", "second"])
    assert args.api_key == "second"


def test_unset_global_flags_stay_none_below_a_subcommand() -> None:
    args = parse(build_parser(), ["info", "sb-abc"])
    assert (args.endpoint, args.api_key, args.data_plane, args.tls_ca) == (None,) * 4
    assert _connect.tls(args) is None


def test_exec_takes_global_flags_before_the_double_dash_and_none_after() -> None:
    args = parse(build_parser(), ["exec", "sb-abc", "--api-key", "K", "--", "echo", "--api-key"])
    assert args.api_key == "K"
    assert args.cmd == ["echo", "--api-key"]


def test_tls_flags_become_the_clients_tls() -> None:
    args = parse(build_parser(), ["ls", "--tls-ca", "/ca.pem", "--tls-server-name", "gw"])
    tls = _connect.tls(args)
    assert tls is not None and (tls.ca, tls.server_name, tls.cert) == ("/ca.pem", "gw", None)


def test_a_subcommands_own_flag_is_not_taken_for_an_abbreviated_global_one() -> None:
    # `up --tls` beside the global --tls-ca/--tls-cert/...: argparse would call it ambiguous.
    args = parse(build_parser(), ["up", "--tls", "--data-plane-proxy", "nginx"])
    assert args.tls is True and args.data_plane_proxy == "nginx"


def test_up_takes_no_client_flags() -> None:
    with pytest.raises(SystemExit) as exc:
        parse(build_parser(), ["up", "--api-key", "K"])
    assert exc.value.code == 2


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["rm"], "nothing to delete"),
        (["rm", "sb-abc", "--all"], "not both"),
        (["rm", "sb-abc", "--label", "a=b"], "not both"),
        (["rm", "--all", "--label", "a=b"], "exclude each other"),
    ],
)
def test_rm_refuses_ambiguous_requests_as_usage_errors(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("orchard: rm: ") and message in err


def test_every_listing_takes_json() -> None:
    parser = build_parser()
    for argv in (
        ["ls"],
        ["info", "sb-abc"],
        ["image", "ls"],
        ["pool", "ls"],
        ["pool", "hint", "t", "1"],
        ["tenant", "ls"],
        ["token-key", "ls"],
    ):
        assert parse(parser, [*argv, "--json"]).json is True, argv
