"""The gateway's REST front over HTTPS (``rest.start_rest`` with the gateway's ServerTLS),
driven by curl: the real aiohttp server, real certificates, real handshakes.

No gateway behind it: the route asked for does not exist, so a 404 JSON answer means
the request got through TLS to the application, and a handshake failure means it did
not (curl exit code 35 or 60, or 56 when the server drops a certificate-less client).
"""

from __future__ import annotations

import asyncio
import json
import shutil

import pytest
from orchard.gateway.rest import start_rest

from orchard.common.tls import ServerTLS

from .certs import Certs, make_certs

pytestmark = pytest.mark.skipif(shutil.which("curl") is None, reason="needs curl")

PATH = "/v1/NoSuchService/Nothing"


async def _curl(url: str, *args: str) -> tuple[int, str]:
    process = await asyncio.create_subprocess_exec(
        "curl", "-sS", "-X", "POST", "--max-time", "10", *args, url,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, err = await process.communicate()
    assert process.returncode is not None
    return process.returncode, (out or err).decode()


async def _serve(tls: ServerTLS, *requests: tuple[str, ...]) -> list[tuple[int, str]]:
    rest = await start_rest("127.0.0.1:0", "unix:/nonexistent.sock", ssl_context=tls.ssl_context())
    try:
        assert rest.address.startswith("https://127.0.0.1:")
        return [await _curl(rest.address + PATH, *args) for args in requests]
    finally:
        await rest.stop()


def _reached(answer: tuple[int, str]) -> bool:
    code, text = answer
    return code == 0 and json.loads(text)["error"]["http_status"] == 404


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certs:
    return make_certs(tmp_path_factory.mktemp("rest-certs"))


def test_https_with_the_ca_and_refusals(certs: Certs) -> None:
    tls = ServerTLS.load(certs.server.cert, certs.server.key)
    trusted, foreign, unchecked = asyncio.run(
        _serve(tls, ("--cacert", str(certs.ca)), ("--cacert", str(certs.other_ca)), ())
    )
    assert _reached(trusted), trusted
    assert foreign[0] == 60, foreign  # peer certificate cannot be authenticated
    assert unchecked[0] == 60, unchecked  # the system's roots do not know the test CA


def test_plain_http_on_the_https_port_is_not_served(certs: Certs) -> None:
    async def main() -> tuple[int, str]:
        tls = ServerTLS.load(certs.server.cert, certs.server.key)
        rest = await start_rest(
            "127.0.0.1:0", "unix:/nonexistent.sock", ssl_context=tls.ssl_context()
        )
        try:
            return await _curl(rest.address.replace("https://", "http://") + PATH)
        finally:
            await rest.stop()

    code, text = asyncio.run(main())
    assert not (code == 0 and '"http_status":404' in text.replace(" ", "")), text


def test_an_expired_certificate_is_refused(certs: Certs) -> None:
    tls = ServerTLS.load(certs.expired_server.cert, certs.expired_server.key)
    (answer,) = asyncio.run(_serve(tls, ("--cacert", str(certs.ca))))
    assert answer[0] == 60, answer
    assert "expired" in answer[1], answer


def test_mutual_tls_on_the_rest_front(certs: Certs) -> None:
    tls = ServerTLS.load(certs.server.cert, certs.server.key, certs.ca)
    ca = ("--cacert", str(certs.ca))
    own = (*ca, "--cert", str(certs.client.cert), "--key", str(certs.client.key))
    stranger = (*ca, "--cert", str(certs.other_client.cert), "--key", str(certs.other_client.key))
    with_cert, without, foreign = asyncio.run(_serve(tls, own, ca, stranger))
    assert _reached(with_cert), with_cert
    assert without[0] != 0 and not _reached(without), without
    assert foreign[0] != 0 and not _reached(foreign), foreign
