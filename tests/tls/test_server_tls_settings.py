"""Server TLS settings (orchard.common.tls), the local CA ``orchard up --tls`` keeps
(orchard.common.local_ca) and the nginx proxy's TLS configuration, with real certificates."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pytest
from cryptography import x509
from orchard.gateway.proxy_nginx import NginxPaths, NginxTLS, render_conf

from orchard.common.local_ca import LocalCA
from orchard.common.tls import ServerTLS, TLSConfigError, server_tls

from .certs import make_certs


def test_from_the_environment_and_flags_first(tmp_path: Path) -> None:
    certs = make_certs(tmp_path)
    env = {"ORCHARD_TLS_CERT": str(certs.server.cert), "ORCHARD_TLS_KEY": str(certs.server.key)}
    tls = server_tls(None, None, environ=env)
    assert tls is not None and tls.cert_file == certs.server.cert and not tls.mutual
    flagged = server_tls(certs.client.cert, certs.client.key, certs.ca, environ=env)
    assert flagged is not None and flagged.cert_file == certs.client.cert and flagged.mutual
    assert server_tls(None, None, environ={}) is None


@pytest.mark.parametrize(
    ("which", "message"),
    [("cert", "the key is missing"), ("key", "the certificate"), ("ca", "needs a server")],
)
def test_half_a_configuration_is_refused(tmp_path: Path, which: str, message: str) -> None:
    certs = make_certs(tmp_path)
    args = {
        "cert": (certs.server.cert, None, None),
        "key": (None, certs.server.key, None),
        "ca": (None, None, certs.ca),
    }[which]
    with pytest.raises(TLSConfigError, match=message):
        server_tls(*args, environ={})


def test_bad_files_are_named(tmp_path: Path) -> None:
    certs = make_certs(tmp_path)
    with pytest.raises(TLSConfigError, match="No such file"):
        ServerTLS.load(tmp_path / "nope.pem", certs.server.key)
    (tmp_path / "junk.pem").write_text("junk")
    with pytest.raises(TLSConfigError, match="not a PEM file"):
        ServerTLS.load(tmp_path / "junk.pem", certs.server.key)
    with pytest.raises(TLSConfigError, match="do not load together"):
        ServerTLS.load(certs.server.cert, certs.client.key)


def test_the_local_ca_is_made_once_and_reused(tmp_path: Path) -> None:
    ca = LocalCA.of_home(tmp_path)
    ca.ensure(["10.1.2.3"])
    assert (ca.root.stat().st_mode & 0o777) == 0o700
    assert (ca.key_file.stat().st_mode & 0o777) == 0o600
    assert (ca.ca_key_file.stat().st_mode & 0o777) == 0o600
    leaf = x509.load_pem_x509_certificate(ca.cert_file.read_bytes())
    san = leaf.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert "localhost" in san.get_values_for_type(x509.DNSName)
    assert {str(i) for i in san.get_values_for_type(x509.IPAddress)} >= {
        "127.0.0.1",
        "::1",
        "10.1.2.3",
    }
    ServerTLS.load(ca.cert_file, ca.key_file)  # the pair loads
    before = (ca.ca_file.read_bytes(), ca.cert_file.read_bytes())
    ca.ensure(["10.1.2.3"])
    assert (ca.ca_file.read_bytes(), ca.cert_file.read_bytes()) == before
    ca.ensure(["gw.example"])  # a new name: a new leaf from the same CA
    assert ca.ca_file.read_bytes() == before[0]
    assert ca.cert_file.read_bytes() != before[1]
    renewed = x509.load_pem_x509_certificate(ca.cert_file.read_bytes())
    assert renewed.not_valid_after_utc - dt.datetime.now(dt.UTC) > dt.timedelta(days=300)


def test_nginx_conf_with_tls_both_ways(tmp_path: Path) -> None:
    certs = make_certs(tmp_path)
    tls = NginxTLS(certs.server.cert, certs.server.key, certs.ca, certs.ca, "localhost")
    conf = render_conf("127.0.0.1:50052", ["127.0.0.1:7070"], NginxPaths(tmp_path, tmp_path), tls)
    assert "listen 127.0.0.1:50052 ssl http2;" in conf
    assert f"ssl_certificate {certs.server.cert};" in conf
    assert "ssl_verify_client on;" in conf
    assert "grpc_pass grpcs://orchard_executors;" in conf
    assert "grpc_ssl_verify on;" in conf
    assert "grpc_ssl_name localhost;" in conf
    plain = render_conf("127.0.0.1:50052", ["127.0.0.1:7070"], NginxPaths(tmp_path, tmp_path))
    assert "ssl" not in plain and "grpc_pass grpc://orchard_executors;" in plain


def test_nginx_tls_refuses_what_could_break_the_conf(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="absolute path"):
        NginxTLS(Path("/a;b.pem"), Path("/k.pem"))
    with pytest.raises(ValueError, match="absolute path"):
        NginxTLS(Path("rel.pem"), Path("/k.pem"))
    with pytest.raises(ValueError, match="host name"):
        NginxTLS(upstream_ca_file=Path("/ca.pem"), upstream_name="x; include /etc")
    with pytest.raises(ValueError, match="both"):
        NginxTLS(cert_file=Path("/c.pem"))


def test_the_private_key_never_shows_in_a_repr(tmp_path: Path) -> None:
    certs = make_certs(tmp_path)
    tls = ServerTLS.load(certs.server.cert, certs.server.key)
    assert b"PRIVATE KEY" in tls.key_pem
    assert "PRIVATE" not in repr(tls) and str(certs.server.key) in repr(tls)
