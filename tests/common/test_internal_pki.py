"""The internal CA and the caller policy, on real files and a real grpc.aio server with mTLS.

The server is a :class:`ServiceRunner` serving the policy's check (as the scheduler does)
over mutual TLS with certificates issued by :class:`InternalPKI`; real gRPC clients call
it with each service's certificate, with a certificate of another CA, with none, and over
a plaintext port of the same server, in every handler shape (unary, response stream,
request stream, bidi: the check runs in the error edge for each).
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from orchard.common.caller_policy import ANY_SERVICE, CallerPolicy
from orchard.common.internal_pki import (
    ENV_INTERNAL_TLS_DIR,
    InternalPKI,
    InternalPKIError,
    ServiceIdentity,
    identity_name,
)
from orchard.common.local_ca import cert_pem, issue, key_pem, make_ca

ALLOWED = "test.Internal"
UNLISTED = "test.Unlisted"
POLICY = CallerPolicy(
    "scheduler",
    {ALLOWED: frozenset({"gateway"}), "grpc.health.v1.Health": frozenset({ANY_SERVICE})},
)


def test_ensure_makes_root_only_files_and_keeps_current_ones(tmp_path: Path) -> None:
    pki = InternalPKI.of_home(tmp_path, environ={})
    assert pki.root == tmp_path / "secrets" / "internal"
    pki.ensure()
    assert pki.root.stat().st_mode & 0o777 == 0o700
    for path in (pki.ca_key_file, pki.key_file("gateway"), pki.key_file("scheduler")):
        assert path.stat().st_mode & 0o777 == 0o600, path
    before = {p.name: p.read_bytes() for p in pki.root.iterdir()}
    pki.ensure()
    assert {p.name: p.read_bytes() for p in pki.root.iterdir()} == before


def test_rotate_makes_a_new_ca_and_reissues_every_certificate(tmp_path: Path) -> None:
    pki = InternalPKI(tmp_path / "internal")
    pki.ensure()
    old_ca, old_gateway = pki.ca_file.read_bytes(), pki.cert_file("gateway").read_bytes()
    pki.rotate()
    assert pki.ca_file.read_bytes() != old_ca
    assert pki.cert_file("gateway").read_bytes() != old_gateway


def test_a_certificate_of_another_ca_is_reissued(tmp_path: Path) -> None:
    pki = InternalPKI(tmp_path / "internal")
    pki.ensure()
    ca, ca_key = make_ca("Orchard internal CA")  # same name, another key
    leaf, key = issue(ca, ca_key, [identity_name("gateway")])
    pki.cert_file("gateway").write_bytes(cert_pem(leaf))
    pki.key_file("gateway").write_bytes(key_pem(key))
    pki.ensure()
    assert pki.cert_file("gateway").read_bytes() != cert_pem(leaf)


def test_a_mounted_folder_without_the_ca_key_is_only_read(tmp_path: Path) -> None:
    issuer = InternalPKI(tmp_path / "issuer")
    issuer.ensure()
    mounted = tmp_path / "mounted"
    mounted.mkdir()
    for name in ("ca.pem", "scheduler.pem", "scheduler.key"):
        (mounted / name).write_bytes((issuer.root / name).read_bytes())
    os.chmod(mounted, 0o500)  # a Secret volume: read-only
    try:
        pki = InternalPKI.of_home(tmp_path, environ={ENV_INTERNAL_TLS_DIR: str(mounted)})
        assert pki.identity("scheduler").service == "scheduler"
        with pytest.raises(InternalPKIError, match=r"gateway.*gateway\.pem"):
            pki.identity("gateway")
    finally:
        os.chmod(mounted, 0o700)


async def _unary(request: bytes, context: Any) -> bytes:
    return b"ok"


async def _stream(request: bytes, context: Any) -> AsyncIterator[bytes]:
    yield b"ok"


async def _request_stream(requests: AsyncIterator[bytes], context: Any) -> bytes:
    async for _ in requests:
        pass
    return b"ok"


async def _bidi(requests: AsyncIterator[bytes], context: Any) -> AsyncIterator[bytes]:
    async for item in requests:
        yield item


def _handlers(service: str) -> grpc.GenericRpcHandler:  # type: ignore[type-arg]
    same = {"request_deserializer": None, "response_serializer": None}
    return grpc.method_handlers_generic_handler(
        service,
        {
            "Unary": grpc.unary_unary_rpc_method_handler(_unary, **same),  # type: ignore[arg-type]
            "Stream": grpc.unary_stream_rpc_method_handler(_stream, **same),  # type: ignore[arg-type]
            "RequestStream": grpc.stream_unary_rpc_method_handler(_request_stream, **same),  # type: ignore[arg-type]
            "Bidi": grpc.stream_stream_rpc_method_handler(_bidi, **same),  # type: ignore[arg-type]
        },
    )


async def _call(channel: grpc.aio.Channel, service: str, shape: str) -> str:
    """``OK`` or the status code name and its message."""
    method = f"/{service}/{shape}"

    async def requests() -> AsyncIterator[bytes]:
        yield b"x"

    try:
        if shape == "Unary":
            await channel.unary_unary(method)(b"x", timeout=10)
        elif shape == "Stream":
            async for _ in channel.unary_stream(method)(b"x", timeout=10):
                pass
        elif shape == "RequestStream":
            await channel.stream_unary(method)(requests(), timeout=10)
        else:
            async for _ in channel.stream_stream(method)(requests(), timeout=10):
                pass
    except grpc.aio.AioRpcError as err:
        return f"{err.code().name}: {err.details()}"
    return "OK"


SHAPES = ("Unary", "Stream", "RequestStream", "Bidi")


def test_the_policy_admits_the_gateway_and_refuses_everyone_else(tmp_path: Path) -> None:
    pki = InternalPKI(tmp_path / "internal")
    pki.ensure()
    server = pki.identity("scheduler")
    ca, ca_key = make_ca("Orchard internal CA")
    leaf, key = issue(ca, ca_key, [identity_name("gateway")])
    forged = ServiceIdentity("gateway", cert_pem(leaf), key_pem(key), server.ca_pem)
    outcomes: dict[str, dict[str, str]] = {}

    async def main() -> None:
        from orchard.common.service_runner import ServiceRunner

        runner = ServiceRunner(
            "scheduler",
            "127.0.0.1:0",
            server_credentials=server.server_credentials(),
            authorize=POLICY.authorize(server.verifier()),
        )
        runner.add_handlers(_handlers(ALLOWED), _handlers(UNLISTED))
        plain_port = runner.server.add_insecure_port("127.0.0.1:0")
        address = await runner.start()
        try:
            channels = {
                "gateway": pki.identity("gateway").aio_channel("scheduler", address),
                "scheduler": server.aio_channel("scheduler", address),
                "forged": forged.aio_channel("scheduler", address),
                "plaintext": grpc.aio.insecure_channel(f"127.0.0.1:{plain_port}"),
            }
            for who, channel in channels.items():
                async with channel:
                    for service in (ALLOWED, UNLISTED):
                        for shape in SHAPES:
                            outcomes.setdefault(who, {})[f"{service}/{shape}"] = await _call(
                                channel, service, shape
                            )
        finally:
            await runner.stop(0)

    asyncio.run(main())
    for shape in SHAPES:
        assert outcomes["gateway"][f"{ALLOWED}/{shape}"] == "OK"
        assert outcomes["gateway"][f"{UNLISTED}/{shape}"] == (
            "PERMISSION_DENIED: the gateway may not call test.Unlisted on the scheduler "
            "(allowed: no service)"
        )
        assert outcomes["scheduler"][f"{ALLOWED}/{shape}"] == (
            "PERMISSION_DENIED: the scheduler may not call test.Internal on the scheduler "
            "(allowed: gateway)"
        )
        # A credential signed by a certificate of another CA: UNAUTHENTICATED, saying so.
        assert outcomes["forged"][f"{ALLOWED}/{shape}"] == (
            "UNAUTHENTICATED: the scheduler refused this call's internal credential: the "
            "certificate was not issued by this deployment's internal CA"
        ), outcomes
        plain = outcomes["plaintext"][f"{ALLOWED}/{shape}"]
        assert plain.startswith(
            "UNAUTHENTICATED: the scheduler is internal: this call carries no internal credential"
        ), plain
