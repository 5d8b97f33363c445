"""The SDK's endpoint parsing and TLS resolution (pure: no network)."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchard.client._errors import ConfigurationError
from orchard.client._tls import TLS, Endpoint, parse_endpoint, resolve_tls


@pytest.mark.parametrize(
    ("text", "target", "tls"),
    [
        ("grpcs://gw.example:443", "gw.example:443", True),
        ("GRPCS://gw.example:443/", "gw.example:443", True),
        ("grpc://127.0.0.1:50051", "127.0.0.1:50051", False),
        ("127.0.0.1:50051", "127.0.0.1:50051", False),
        ("grpcs://[::1]:50051", "[::1]:50051", True),
        ("unix:/run/orchard/executor.sock", "unix:/run/orchard/executor.sock", False),
    ],
)
def test_grpc_endpoints(text: str, target: str, tls: bool) -> None:
    endpoint = parse_endpoint(text)
    assert (endpoint.target, endpoint.tls) == (target, tls)


def test_rest_endpoints() -> None:
    assert parse_endpoint("https://gw:50080", rest=True) == Endpoint("gw:50080", True, "https")
    assert parse_endpoint("gw:50080", rest=True) == Endpoint("gw:50080", False, "http")
    with pytest.raises(ConfigurationError, match="scheme 'grpcs'"):
        parse_endpoint("grpcs://gw:50051", rest=True)


@pytest.mark.parametrize(
    "text",
    ["https://gw:443", "ftp://gw:21", "gw", "grpcs://gw", "grpcs://gw:0", "grpcs://gw:99999",
     "grpcs://gw:443/path", "grpcs://user@gw:443", "unix:", "grpcs://gw :443"],
)  # fmt: skip
def test_anything_else_is_refused_with_the_endpoint_named(text: str) -> None:
    with pytest.raises(ConfigurationError, match="endpoint"):
        parse_endpoint(text)


def test_str_round_trips() -> None:
    for text in ("grpcs://gw:443", "gw:1", "unix:/x.sock"):
        assert str(parse_endpoint(text)) == text
    assert str(parse_endpoint("grpc://gw:1")) == "gw:1"


def test_a_plaintext_endpoint_uses_no_tls_and_refuses_an_explicit_one() -> None:
    assert resolve_tls(parse_endpoint("gw:1"), environ={}) is None
    with pytest.raises(ConfigurationError, match="grpcs://gw:1"):
        resolve_tls(parse_endpoint("gw:1"), TLS(), environ={})


def test_resolution_order(tmp_path: Path) -> None:
    secure = parse_endpoint("grpcs://gw:1")
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "ca.pem").write_text("-----BEGIN CERTIFICATE-----\n")
    env = {"ORCHARD_TLS_CA": "/etc/orchard/ca.pem"}
    explicit = TLS(ca=b"-----BEGIN CERTIFICATE-----\n")
    assert resolve_tls(secure, explicit, environ=env, home=tmp_path) is explicit
    assert resolve_tls(secure, environ=env, home=tmp_path) == TLS(ca="/etc/orchard/ca.pem")
    assert resolve_tls(secure, environ={}, home=tmp_path) == TLS(ca=tmp_path / "run" / "ca.pem")
    # An endpoint that did not come from the home does not trust the home's CA.
    assert resolve_tls(secure, environ={}, home=None) == TLS()


def test_client_certificate_from_the_environment() -> None:
    env = {"ORCHARD_TLS_CERT": "/c.pem", "ORCHARD_TLS_KEY": "/c.key"}
    assert TLS.from_env(env) == TLS(cert="/c.pem", key="/c.key")
    with pytest.raises(ConfigurationError, match="needs its key"):
        TLS.from_env({"ORCHARD_TLS_CERT": "/c.pem"})


def test_unreadable_or_non_pem_files_are_named(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match=str(tmp_path / "missing.pem")):
        TLS(ca=tmp_path / "missing.pem").channel_credentials()
    (tmp_path / "junk.pem").write_text("not a certificate")
    with pytest.raises(ConfigurationError, match="not PEM"):
        TLS(ca=tmp_path / "junk.pem").channel_credentials()


def test_server_name_becomes_the_target_name_override() -> None:
    assert TLS(server_name="gw.internal").channel_options() == [
        ("grpc.ssl_target_name_override", "gw.internal")
    ]
    assert TLS().channel_options() == []


def test_a_key_given_as_pem_never_shows_in_a_repr() -> None:
    tls = TLS(cert=b"-----BEGIN CERTIFICATE-----", key=b"-----BEGIN PRIVATE KEY-----secret")
    assert "secret" not in repr(tls) and "PRIVATE" not in repr(tls)
