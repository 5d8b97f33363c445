"""The chart's internal certificates, rendered by Helm's own engine, used for real mTLS.

Each pod's folder is built from what the chart renders (the Secret's data placed at the
paths of the Deployment's volume items), then a real grpc.aio server with the scheduler's
caller policy serves with the scheduler's and is called with the gateway's and the
scheduler's, as the pods would: a mismatch in names, key formats or usages fails here.
"""

from __future__ import annotations

import asyncio
import base64
from pathlib import Path
from typing import Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from orchard.scheduler.callers import SCHEDULER_CALLERS

from orchard.common.internal_pki import ENV_INTERNAL_TLS_DIR, InternalPKI
from orchard.common.service_runner import ServiceRunner

from .test_helm_chart import render


def _docs() -> list[dict[str, Any]]:
    return render()  # the defaults, with the tenant every install needs


def _pod_folder(docs: list[dict[str, Any]], service: str, root: Path) -> Path:
    """What the ``service`` pod sees at $ORCHARD_INTERNAL_TLS_DIR."""
    deployment = next(
        d
        for d in docs
        if d["kind"] == "Deployment" and d["metadata"]["name"] == f"orchard-{service}"
    )
    pod = deployment["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    env = {e["name"]: e.get("value") for e in container.get("env", [])}
    mount = next(m for m in container["volumeMounts"] if m["name"] == "internal-tls")
    assert env[ENV_INTERNAL_TLS_DIR] == mount["mountPath"] and mount["readOnly"] is True
    volume = next(v for v in pod["volumes"] if v["name"] == "internal-tls")["secret"]
    secret = next(
        d for d in docs if d["kind"] == "Secret" and d["metadata"]["name"] == volume["secretName"]
    )
    assert secret["type"] == "kubernetes.io/tls"
    folder = root / service
    folder.mkdir()
    for item in volume["items"]:
        (folder / item["path"]).write_bytes(base64.b64decode(secret["data"][item["key"]]))
    return folder


def test_each_pod_mounts_only_its_own_certificate(tmp_path: Path) -> None:
    docs = _docs()
    for service, other in (("gateway", "scheduler"), ("scheduler", "gateway")):
        folder = _pod_folder(docs, service, tmp_path)
        names = sorted(p.name for p in folder.iterdir())
        assert names == sorted(["ca.pem", f"{service}.pem", f"{service}.key"])
        assert not (folder / f"{other}.key").exists()


def test_the_rendered_certificates_do_mutual_tls_under_the_scheduler_policy(
    tmp_path: Path,
) -> None:
    docs = _docs()
    gateway = InternalPKI(_pod_folder(docs, "gateway", tmp_path)).identity("gateway")
    scheduler = InternalPKI(_pod_folder(docs, "scheduler", tmp_path)).identity("scheduler")
    got: dict[str, str] = {}

    async def main() -> None:
        runner = ServiceRunner(
            "scheduler",
            "127.0.0.1:0",
            server_credentials=scheduler.server_credentials(),
            authorize=SCHEDULER_CALLERS.authorize(scheduler.verifier()),
        )
        runner.add_handlers(
            grpc.method_handlers_generic_handler(
                "orchard.v1.SandboxService",
                {"ListSandboxes": grpc.unary_unary_rpc_method_handler(_ok)},
            )
        )
        address = await runner.start()
        await runner.serving()
        try:
            for who, identity in (("gateway", gateway), ("scheduler", scheduler)):
                async with identity.aio_channel("scheduler", address) as channel:
                    health = health_pb2_grpc.HealthStub(channel)
                    answer = await health.Check(health_pb2.HealthCheckRequest(), timeout=10)
                    got[f"{who} health"] = health_pb2.HealthCheckResponse.ServingStatus.Name(
                        answer.status
                    )
                    try:
                        await channel.unary_unary("/orchard.v1.SandboxService/ListSandboxes")(
                            b"", timeout=10
                        )
                        got[f"{who} list"] = "OK"
                    except grpc.aio.AioRpcError as err:
                        got[f"{who} list"] = err.code().name
            # A pod with no certificate: TLS trusting the CA, no credential.
            bare = grpc.ssl_channel_credentials(root_certificates=scheduler.ca_pem)
            options = scheduler.channel_options("scheduler")
            async with grpc.aio.secure_channel(address, bare, options=options) as channel:
                try:
                    await channel.unary_unary("/orchard.v1.SandboxService/ListSandboxes")(
                        b"", timeout=10
                    )
                    got["uncredentialed list"] = "OK"
                except grpc.aio.AioRpcError as err:
                    got["uncredentialed list"] = err.code().name
        finally:
            await runner.stop(0)

    asyncio.run(main())
    assert got == {
        "uncredentialed list": "UNAUTHENTICATED",
        "gateway health": "SERVING",
        "gateway list": "OK",
        "scheduler health": "SERVING",
        "scheduler list": "PERMISSION_DENIED",
    }


async def _ok(request: bytes, context: Any) -> bytes:
    return b""
