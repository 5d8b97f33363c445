"""A real registry on loopback for the pull tests: Debian's ``docker-registry`` (the CNCF
distribution server, 2.8) with a config file written here, plus what it can point at:

- ``htpasswd`` basic auth (bcrypt hashes from the C library's crypt);
- ``token`` auth: :class:`TokenServer`, a small real HTTP server issuing RS256 JWTs signed
  with a key and self-signed certificate made here (the registry's ``rootcertbundle``),
  the certificate carried in the token's ``x5c`` header as the registry checks it;
- :class:`ThrottledProxy`: a TCP forwarder with a byte rate, so a test can kill a pull
  half-way through a layer (loopback is otherwise too fast to catch one mid-blob).

Images are pushed with ``skopeo copy`` from OCI layouts the tests build (:mod:`.oci_images`).
"""

from __future__ import annotations

import base64
import contextlib
import datetime as dt
import json
import os
import secrets
import shutil
import socket
import subprocess
import threading
import time
import urllib.error
import urllib.request
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import padding, rsa
from cryptography.x509.oid import NameOID

from orchard.common import local_ca

REGISTRY = shutil.which("docker-registry") or "/usr/bin/docker-registry"
SKOPEO = shutil.which("skopeo") or "/usr/bin/skopeo"
SERVICE = "orchard-test-registry"
ISSUER = "orchard-test-token-issuer"


def have_tools() -> str | None:
    for tool in (REGISTRY, SKOPEO):
        if not os.access(tool, os.X_OK):
            return f"needs {Path(tool).name} (apt-get install docker-registry skopeo)"
    return None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def bcrypt_hash(password: str) -> str:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        import crypt  # libxcrypt's bcrypt, what the registry's htpasswd reader wants

        return crypt.crypt(password, crypt.mksalt(crypt.METHOD_BLOWFISH, rounds=16))


def _b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


@dataclass
class TokenServer:
    """``GET /token?service=&scope=``: a JWT for the scopes asked. A user with the right
    password gets every action asked; an anonymous caller gets ``pull`` on
    ``public_repos`` only (nothing elsewhere, so the registry answers 401 again)."""

    folder: Path
    users: dict[str, str]
    public_repos: set[str] = field(default_factory=set)
    requests: list[dict[str, Any]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "orchard test token signer")])
        now = dt.datetime.now(dt.UTC)
        self.cert = (
            x509.CertificateBuilder()
            .subject_name(name)
            .issuer_name(name)
            .public_key(self.key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(hours=1))
            .not_valid_after(now + dt.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(self.key, hashes.SHA256())
        )
        self.cert_path = self.folder / "token-signer.pem"
        self.cert_path.write_bytes(self.cert.public_bytes(serialization.Encoding.PEM))
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                status, body = server.answer(self.path, self.headers.get("Authorization", ""))
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = int(self.httpd.server_address[1])
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    @property
    def realm(self) -> str:
        return f"http://127.0.0.1:{self.port}/token"

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    def answer(self, path: str, authorization: str) -> tuple[int, dict[str, Any]]:
        query = parse_qs(urlsplit(path).query)
        user = ""
        if authorization.startswith("Basic "):
            name, _, password = base64.b64decode(authorization[6:]).decode().partition(":")
            if self.users.get(name) != password:
                self.requests.append({"user": name, "refused": True})
                return 401, {"details": "bad credentials"}
            user = name
        access = []
        for scope in query.get("scope", []):
            kind, _, rest = scope.partition(":")
            repo, _, actions = rest.rpartition(":")
            wanted = actions.split(",")
            granted = wanted if user else [a for a in wanted if a == "pull"]
            if not user and repo not in self.public_repos:
                granted = []
            access.append({"type": kind, "name": repo, "actions": granted})
        self.requests.append({"user": user, "scopes": query.get("scope", []), "access": access})
        return 200, {"token": self.token(user, access), "expires_in": 300}

    def token(self, subject: str, access: list[dict[str, Any]]) -> str:
        cert_der = self.cert.public_bytes(serialization.Encoding.DER)
        header = {"typ": "JWT", "alg": "RS256", "x5c": [base64.b64encode(cert_der).decode()]}
        now = int(time.time())
        claims = {
            "iss": ISSUER,
            "sub": subject,
            "aud": SERVICE,
            "exp": now + 300,
            "nbf": now - 30,
            "iat": now,
            "jti": secrets.token_hex(8),
            "access": access,
        }
        signing_input = (
            f"{_b64url(json.dumps(header).encode())}.{_b64url(json.dumps(claims).encode())}"
        )
        signature = self.key.sign(signing_input.encode(), padding.PKCS1v15(), hashes.SHA256())
        return f"{signing_input}.{_b64url(signature)}"


@dataclass
class Registry:
    host: str
    """``127.0.0.1:<port>``: what image references name."""
    folder: Path
    proc: subprocess.Popen[bytes]
    creds: str | None = None
    """``user:password`` skopeo pushes with (None: anonymous)."""

    def push(self, layout: Path, tag: str, repo: str, *, all_platforms: bool = False) -> None:
        # --preserve-digests: push the layout byte for byte (skopeo would gzip plain layers).
        cmd = [SKOPEO, "copy", "--quiet", "--preserve-digests", "--dest-tls-verify=false"]
        if all_platforms:
            cmd.append("--all")
        if self.creds:
            cmd += ["--dest-creds", self.creds]
        cmd += [f"oci:{layout}:{tag}", f"docker://{self.host}/{repo}:{tag}"]
        subprocess.run(cmd, check=True, capture_output=True, timeout=120)

    def log(self) -> str:
        return (self.folder / "registry.log").read_text(errors="replace")


def _config(folder: Path, port: int, auth: dict[str, Any] | None) -> str:
    lines = [
        "version: 0.1",
        "log:",
        "  level: info",
        "  accesslog:",
        "    disabled: false",
        "storage:",
        "  filesystem:",
        f"    rootdirectory: {folder / 'storage'}",
        "  delete:",
        "    enabled: true",
        "http:",
        f"  addr: 127.0.0.1:{port}",
        f"  secret: {secrets.token_hex(16)}",
    ]
    if auth:
        lines.append("auth:")
        for kind, params in auth.items():
            lines.append(f"  {kind}:")
            lines += [f"    {key}: {value}" for key, value in params.items()]
    return "\n".join(lines) + "\n"


@contextlib.contextmanager
def running_registry(
    folder: Path,
    *,
    htpasswd: dict[str, str] | None = None,
    token: TokenServer | None = None,
    creds: str | None = None,
    tls: bool = False,
) -> Iterator[Registry]:
    """``docker-registry serve`` on a free loopback port with storage in ``folder``; with
    ``tls``, HTTPS with a certificate for 127.0.0.1 from a CA written to ``folder/ca.pem``."""
    folder.mkdir(parents=True, exist_ok=True)
    auth: dict[str, Any] | None = None
    if htpasswd is not None:
        path = folder / "htpasswd"
        path.write_text("".join(f"{u}:{bcrypt_hash(p)}\n" for u, p in htpasswd.items()))
        auth = {"htpasswd": {"realm": "orchard-test", "path": str(path)}}
    elif token is not None:
        auth = {
            "token": {
                "realm": token.realm,
                "service": SERVICE,
                "issuer": ISSUER,
                "rootcertbundle": str(token.cert_path),
            }
        }
    port = free_port()
    config = folder / "config.yml"
    text = _config(folder, port, auth)
    if tls:
        cert, key = _server_cert(folder)
        text = text.replace(
            "http:\n", f"http:\n  tls:\n    certificate: {cert}\n    key: {key}\n", 1
        )
    config.write_text(text)
    with open(folder / "registry.log", "wb") as log:
        proc = subprocess.Popen([REGISTRY, "serve", str(config)], stdout=log, stderr=log)
    registry = Registry(f"127.0.0.1:{port}", folder, proc, creds)
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                if tls:
                    socket.create_connection(("127.0.0.1", port), timeout=2).close()
                else:
                    urllib.request.urlopen(f"http://{registry.host}/v2/", timeout=2).close()
                break
            except urllib.error.HTTPError:
                break  # 401: up, and asking for auth
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(
                        f"docker-registry did not start:\n{registry.log()}"
                    ) from None
                time.sleep(0.05)
        yield registry
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _server_cert(folder: Path) -> tuple[Path, Path]:
    """A CA (``ca.pem``) and a server certificate for IP 127.0.0.1 signed by it (the
    same CA code ``orchard up --tls`` uses)."""
    ca, ca_key = local_ca.make_ca("orchard test registry CA")
    cert, key = local_ca.issue(ca, ca_key, ["127.0.0.1"])
    (folder / "ca.pem").write_bytes(local_ca.cert_pem(ca))
    cert_path, key_path = folder / "server.pem", folder / "server.key"
    cert_path.write_bytes(local_ca.cert_pem(cert))
    key_path.write_bytes(local_ca.key_pem(key))
    return cert_path, key_path


class ThrottledProxy:
    """``127.0.0.1:<port>`` forwarding to ``target`` at about ``rate`` bytes/s downstream
    (0: no limit); with ``cut_after``, the first connection that carries more than that many
    bytes downstream is closed there, once (a network drop in the middle of a blob); with
    ``strip_range``, requests reach the registry without their ``Range`` header."""

    def __init__(
        self, target: str, rate: int, cut_after: int = 0, strip_range: bool = False
    ) -> None:
        self.target_host, _, port = target.rpartition(":")
        self.target_port = int(port)
        self.rate = rate
        self.cut_after = cut_after
        self.cuts = 0
        self.lock = threading.Lock()
        self.strip_range = strip_range
        """Rename requests' ``Range`` header (same length): a registry that ignores ranges."""
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = int(self.listener.getsockname()[1])
        self.closed = False
        self.sent = 0
        """Bytes forwarded downstream (registry -> client) so far."""
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def host(self) -> str:
        return f"127.0.0.1:{self.port}"

    def close(self) -> None:
        self.closed = True
        self.listener.close()

    def _accept(self) -> None:
        while not self.closed:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            upstream = socket.create_connection((self.target_host, self.target_port))
            threading.Thread(target=self._pipe, args=(client, upstream, False), daemon=True).start()
            threading.Thread(target=self._pipe, args=(upstream, client, True), daemon=True).start()

    def _pipe(self, src: socket.socket, dst: socket.socket, downstream: bool) -> None:
        chunk = 64 << 10
        carried = 0
        try:
            while data := src.recv(chunk):
                if not downstream and self.strip_range:
                    data = data.replace(b"\r\nRange:", b"\r\nXange:")
                dst.sendall(data)
                if not downstream:
                    continue
                carried += len(data)
                with self.lock:  # one pipe thread per connection: += is not atomic
                    self.sent += len(data)
                    cut = self.cut_after and not self.cuts and carried > self.cut_after
                    self.cuts += 1 if cut else 0
                if cut:
                    return
                if self.rate:
                    time.sleep(len(data) / self.rate)
        except OSError:
            pass
        finally:
            for sock in (src, dst):
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
                sock.close()
