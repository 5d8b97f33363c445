"""The Helm chart installs a working, safe deployment: what rendering can show.

- Tenants: the chart's Secret holds exactly the files the gateway reads; the test
  projects it as the kubelet does (symlinked, swapped atomically on update) and runs
  the real gateway on it (``--tenants-dir``): a listed key is forwarded as its tenant, a
  rotated-out key is refused, without a restart.
- The token key survives ``helm upgrade``: Helm's real engine runs ``lookup`` against a
  FAKE API server holding the Secret a first install made (``lookup_apiserver``), twice.
- Control-plane NetworkPolicies: the rendered policies are evaluated with Kubernetes'
  NetworkPolicy semantics for each pair of pods (who reaches the scheduler, the egress
  proxy, the gateway). Enforcement itself is the CNI's and needs a cluster.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import ipaddress
import json
import os
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from helm_python import _native
from helm_python.config import Config
from orchard.gateway.__main__ import parse_args
from orchard.gateway.auth import ApiKeyAuth
from orchard.gateway.server import start
from orchard.scheduler.backends.base import SandboxSpec
from orchard.scheduler.backends.kubernetes import KubernetesSettings, PodTemplate
from orchard.scheduler.backends.kubernetes import manifests as m
from orchard.scheduler.backends.netpolicy.settings import EgressLimits

from orchard._proto.orchard.v1 import sandbox_pb2, sandbox_pb2_grpc
from orchard.common.internal_pki import InternalPKI
from orchard.common.quotas import Quota, QuotaTable
from orchard.common.tokens import Revocations

from .lookup_apiserver import LookupApiServer
from .test_helm_chart import CHART, RELEASE_NS, render

Doc = dict[str, Any]


def _key_and_hash(name: str) -> tuple[str, str]:
    key = f"ork_{name}_" + hashlib.sha256(name.encode()).hexdigest()[:32]
    return key, hashlib.sha256(key.encode()).hexdigest()


OLD_KEY, OLD_HASH = _key_and_hash("old")
NEW_KEY, NEW_HASH = _key_and_hash("new")


def _secret(docs: list[Doc], name: str, namespace: str = RELEASE_NS) -> Doc:
    return next(
        d
        for d in docs
        if d["kind"] == "Secret"
        and d["metadata"]["name"] == name
        and d["metadata"]["namespace"] == namespace
    )


def _deployment(docs: list[Doc], name: str) -> Doc:
    return next(d for d in docs if d["kind"] == "Deployment" and d["metadata"]["name"] == name)


def _files(secret: Doc) -> dict[str, bytes]:
    return {k: base64.b64decode(v) for k, v in secret["data"].items()}


def project_secret(folder: Path, files: dict[str, bytes]) -> None:
    """Write ``files`` as the kubelet projects a Secret volume (its AtomicWriter): a
    timestamped folder, ``..data`` pointing at it, each key a symlink through ``..data``;
    an update makes a new folder and renames a new ``..data`` link over the old one."""
    folder.mkdir(exist_ok=True)
    stamp = folder / f"..{time.time_ns()}"
    stamp.mkdir()
    for name, data in files.items():
        (stamp / name).write_bytes(data)
    old = os.readlink(folder / "..data") if (folder / "..data").is_symlink() else None
    (folder / "..data_tmp").symlink_to(stamp.name)
    os.replace(folder / "..data_tmp", folder / "..data")
    for name in files:
        if not (folder / name).is_symlink():
            (folder / name).symlink_to(f"..data/{name}")
    if old is not None:
        for leftover in (folder / old).iterdir():
            leftover.unlink()
        (folder / old).rmdir()


def _tenants(*hashes: str) -> dict[str, Any]:
    return {
        "tenants": [
            {"name": "research", "apiKeySha256": list(hashes), "quota": {"max_sandboxes": 3}},
            {"name": "revoked", "apiKeySha256": [], "revokedBefore": 1796190000},
        ],
        "defaultQuota": {"create_rate": 5},
    }


# ---- tenants ------------------------------------------------------------------------


def test_the_rendered_tenants_are_what_the_gateways_loaders_read(tmp_path: Path) -> None:
    files = _files(_secret(render(_tenants(OLD_HASH)), "orchard-tenants"))
    assert set(files) == {"api_keys.json", "quotas.json", "revocations.json"}
    project_secret(tmp_path, files)
    auth = ApiKeyAuth(tmp_path / "api_keys.json")
    assert auth.tenant_for(f"Bearer {OLD_KEY}") == "research"
    table = QuotaTable.parse((tmp_path / "quotas.json").read_text())
    assert table.for_tenant("research") == Quota(max_sandboxes=3, create_rate=5)
    assert table.for_tenant("anyone-else") == Quota(create_rate=5)
    # What the scheduler pushes to the revoked tenant's pods (revocation_push).
    revocations = Revocations(tmp_path / "revocations.json")
    assert revocations.table() == {"revoked": 1796190000.0}


def test_the_chart_refuses_tenant_values_the_gateway_could_not_use() -> None:
    cases: list[tuple[dict[str, Any], str]] = [
        ({"tenants": []}, "no tenant has an API key hash"),
        ({"tenants": [{"name": "a", "apiKeySha256": "0" * 63}]}, "is not a lowercase hex"),
        ({"tenants": [{"name": "a b", "apiKeySha256": OLD_HASH}]}, "invalid tenant name"),
        (
            {"tenants": [{"name": "a", "apiKeySha256": OLD_HASH, "quota": {"max_sandbox": 1}}]},
            'unknown quota "max_sandbox"',
        ),
        (
            {"tenants": _tenants(OLD_HASH)["tenants"], "tenantsExistingSecret": "mine"},
            "both set",
        ),
        (
            {"tenants": [{"name": "a", "apiKeySha256": OLD_HASH, "revokedBefore": "soon"}]},
            "is not unix seconds",
        ),
    ]
    for values, message in cases:
        with pytest.raises(Exception, match=message):
            render(values)


def test_the_charts_quota_names_are_the_gateways() -> None:
    """The chart checks quota names at render (a typo would otherwise leave the gateway
    on its last good table: unlimited at start); its list is the Quota dataclass's."""
    text = (CHART / "templates" / "tenants.yaml").read_text()
    line = next(ln for ln in text.splitlines() if "$known := list" in ln)
    assert set(line.split("list", 1)[1].replace('"', " ").split()) - {"}}"} == set(
        Quota().__dataclass_fields__
    )


def test_an_existing_tenants_secret_is_mounted_and_none_rendered() -> None:
    docs = render({"tenantsExistingSecret": "my-tenants"})
    assert not [d for d in docs if d["metadata"]["name"] == "orchard-tenants"]
    gateway = _deployment(docs, "orchard-gateway")
    volumes = {v["name"]: v for v in gateway["spec"]["template"]["spec"]["volumes"]}
    assert volumes["tenants"]["secret"]["secretName"] == "my-tenants"


class RecordingScheduler(sandbox_pb2_grpc.SandboxServiceServicer):
    """Stands in for the scheduler (the gateway's upstream): records the tenant it is told."""

    def __init__(self) -> None:
        self.tenants: list[str] = []

    async def ListSandboxes(
        self, request: sandbox_pb2.ListSandboxesRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> sandbox_pb2.ListSandboxesResponse:
        self.tenants.append(dict(context.invocation_metadata() or ()).get("orchard-tenant", ""))
        return sandbox_pb2.ListSandboxesResponse()


@asynccontextmanager
async def _scheduler(home: Path) -> AsyncIterator[tuple[str, RecordingScheduler]]:
    """A recording SandboxService served as the real scheduler is: mutual TLS with the
    scheduler's internal certificate of ``home`` (the gateway of ``home`` presents its own)."""
    server = grpc.aio.server()
    servicer = RecordingScheduler()
    sandbox_pb2_grpc.add_SandboxServiceServicer_to_server(servicer, server)
    identity = InternalPKI.of_home(home, environ={}).identity("scheduler")
    port = server.add_secure_port("127.0.0.1:0", identity.server_credentials())
    await server.start()
    try:
        yield f"127.0.0.1:{port}", servicer
    finally:
        await server.stop(None)


def _gateway_args(docs: list[Doc]) -> list[str]:
    gateway = _deployment(docs, "orchard-gateway")
    args: list[str] = gateway["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[:3] == ["python", "-m", "orchard.gateway"]
    return args[3:]


async def _status(stub: Any, key: str) -> grpc.StatusCode:
    try:
        await stub.ListSandboxes(
            sandbox_pb2.ListSandboxesRequest(), metadata=[("authorization", f"Bearer {key}")]
        )
    except grpc.aio.AioRpcError as exc:
        return exc.code()
    return grpc.StatusCode.OK


def test_the_gateway_started_as_the_chart_says_serves_the_secrets_keys(tmp_path: Path) -> None:
    """The gateway, with the chart's own arguments (addresses and paths moved to the test's
    folders), authenticates a key of the rendered Secret and forwards it as its tenant;
    a rotation rendered and projected as the kubelet does takes effect with no restart;
    its health-only port answers the kubelet's gRPC probe in plaintext with TLS off."""
    tenants_dir = tmp_path / "tenants"
    docs = render({**_tenants(OLD_HASH, NEW_HASH), "gateway": {"tls": {"enabled": False}}})
    project_secret(tenants_dir, _files(_secret(docs, "orchard-tenants")))
    chart_args = _gateway_args(docs)
    assert "--tenants-dir=/etc/orchard/tenants" in chart_args
    assert "--no-dev-key" in chart_args

    async def scenario() -> None:
        async with _scheduler(tmp_path / "home") as (scheduler_address, scheduler):
            moved = {
                "--home": str(tmp_path / "home"),
                "--tenants-dir": str(tenants_dir),
                "--scheduler": scheduler_address,
                "--listen": "127.0.0.1:0",
                "--http-listen": "127.0.0.1:0",
                "--metrics-listen": "127.0.0.1:0",
                "--health-listen": "127.0.0.1:0",
            }
            args = [
                f"{a.split('=')[0]}={moved[a.split('=')[0]]}" if a.split("=")[0] in moved else a
                for a in chart_args
            ]
            running = await start(parse_args(args))
            try:
                assert running.health_port is not None
                async with grpc.aio.insecure_channel(running.health_port.address) as ch:
                    health = health_pb2_grpc.HealthStub(ch)
                    reply = await health.Check(health_pb2.HealthCheckRequest(service=""))
                    assert reply.status == health_pb2.HealthCheckResponse.SERVING
                async with grpc.aio.insecure_channel(running.address) as channel:
                    stub = sandbox_pb2_grpc.SandboxServiceStub(channel)
                    assert await _status(stub, OLD_KEY) == grpc.StatusCode.OK
                    assert await _status(stub, NEW_KEY) == grpc.StatusCode.OK
                    assert await _status(stub, "ork_unknown") == grpc.StatusCode.UNAUTHENTICATED
                    assert scheduler.tenants == ["research", "research"]
                    # The rotation finishes: the old hash leaves the values, helm upgrade.
                    rotated = render({**_tenants(NEW_HASH), "gateway": {"tls": {"enabled": False}}})
                    project_secret(tenants_dir, _files(_secret(rotated, "orchard-tenants")))
                    assert await _status(stub, OLD_KEY) == grpc.StatusCode.UNAUTHENTICATED
                    assert await _status(stub, NEW_KEY) == grpc.StatusCode.OK
            finally:
                await running.stop(0)

    asyncio.run(scenario())


def test_the_gateway_refuses_to_start_without_the_tenants_files(tmp_path: Path) -> None:
    with pytest.raises(SystemExit):
        parse_args(["--scheduler=127.0.0.1:1", f"--tenants-dir={tmp_path}"])


# ---- token key ----------------------------------------------------------------------


def _dry_run_install(api: LookupApiServer, values: dict[str, Any]) -> list[Doc]:
    """``helm install --dry-run=server`` by Helm's engine: ``lookup`` asks ``api``.
    (helm-python-sdk's ``install`` has no ``disable_openapi_validation`` argument; its
    native call takes the option, so the call is made with it.)"""
    import yaml
    from helm_python.config import _NONE, _loads_obj, _opts

    with Config(kubeconfig_content=api.kubeconfig(), storage_driver="memory") as cfg:
        payload = _native.call_string(
            "helm_install",
            cfg._raw(),
            _native.HANDLE(_NONE),
            _native.HANDLE(_NONE),
            str(CHART),
            "orchard",
            json.dumps(values),
            _opts(namespace=RELEASE_NS, dry_run="server", disable_openapi_validation=True),
        )
    manifest = _loads_obj(payload)["manifest"]
    return [d for d in yaml.safe_load_all(manifest) if d]


def test_upgrades_keep_the_token_key_a_first_install_made() -> None:
    key = base64.b64encode(b"k" * 32).decode()
    api = LookupApiServer().start()
    try:
        api.put_secret(
            RELEASE_NS, "orchard-executor-token", {"token.key": key}, ("orchard", RELEASE_NS)
        )
        values = _tenants(OLD_HASH)
        renders = [_dry_run_install(api, values) for _ in range(2)]
        assert f"GET /api/v1/namespaces/{RELEASE_NS}/secrets/orchard-executor-token" in (
            api.requests
        )
        assert not [r for r in api.requests if not r.startswith("GET ")]  # a dry run
    finally:
        api.stop()
    for docs in renders:
        assert _secret(docs, "orchard-executor-token", RELEASE_NS)["data"]["token.key"] == key


def test_an_existing_token_secret_is_used_and_none_rendered() -> None:
    docs = render({"tokenKey": {"existingSecret": "my-token"}})
    assert not [d for d in docs if d["metadata"]["name"] == "orchard-executor-token"]
    scheduler = _deployment(docs, "orchard-scheduler")
    pod = scheduler["spec"]["template"]["spec"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["token"]["secret"]["secretName"] == "my-token"


# ---- control-plane NetworkPolicies --------------------------------------------------


@dataclass(frozen=True)
class Pod:
    namespace: str
    labels: dict[str, str]
    ip: str = "10.1.2.3"


def _matches(selector: dict[str, Any] | None, labels: dict[str, str]) -> bool:
    if selector is None:
        return True
    assert set(selector) <= {"matchLabels"}, "the evaluator knows matchLabels only"
    return all(labels.get(k) == v for k, v in (selector.get("matchLabels") or {}).items())


def _peer_matches(peer: dict[str, Any], policy_ns: str, pod: Pod) -> bool:
    if "ipBlock" in peer:
        block = peer["ipBlock"]
        ip = ipaddress.ip_address(pod.ip)
        return ip in ipaddress.ip_network(block["cidr"]) and not any(
            ip in ipaddress.ip_network(e) for e in block.get("except", ())
        )
    ns_labels = {"kubernetes.io/metadata.name": pod.namespace}
    if "namespaceSelector" in peer:
        if not _matches(peer["namespaceSelector"], ns_labels):
            return False
    elif pod.namespace != policy_ns:
        return False
    return _matches(peer.get("podSelector"), pod.labels)


def _allows(docs: list[Doc], direction: str, subject: Pod, other: Pod, port: int) -> bool:
    """Kubernetes NetworkPolicy semantics: a pod selected by any policy of that direction is
    isolated; then a connection is allowed if a rule of one of those policies matches."""
    kind, peers = ("Ingress", "from") if direction == "ingress" else ("Egress", "to")
    selecting = [
        d
        for d in docs
        if d["kind"] == "NetworkPolicy"
        and d["metadata"]["namespace"] == subject.namespace
        and kind in d["spec"]["policyTypes"]
        and _matches(d["spec"]["podSelector"], subject.labels)
    ]
    if not selecting:
        return True
    for policy in selecting:
        for rule in policy["spec"].get(direction, []):
            ports = rule.get("ports")
            if ports is not None and not any(p.get("port") == port for p in ports):
                continue
            if "peers" not in rule and peers not in rule:
                return True
            if any(_peer_matches(p, subject.namespace, other) for p in rule[peers]):
                return True
    return False


def connects(docs: list[Doc], src: Pod, dst: Pod, port: int) -> bool:
    return _allows(docs, "egress", src, dst, port) and _allows(docs, "ingress", dst, src, port)


def _component(docs: list[Doc], name: str) -> Pod:
    d = _deployment(docs, name)
    return Pod(RELEASE_NS, d["spec"]["template"]["metadata"]["labels"], ip="10.1.0.5")


def _sandbox(network: str, ns: str = "orchard-sandboxes") -> Pod:
    settings = KubernetesSettings(namespace=ns, control_namespace=RELEASE_NS)
    spec = SandboxSpec(sandbox_id=f"sb-{network}", network_mode="none")
    pod = m.sandbox_pod(spec, settings, PodTemplate(network_class=network), deadline_seconds=60)
    return Pod(ns, pod["metadata"]["labels"], ip="10.2.0.9")


def test_only_the_gateway_reaches_the_scheduler_and_only_allowlist_sandboxes_the_proxy() -> None:
    docs = render({"networkPolicies": {"metricsFrom": []}})
    gateway = _component(docs, "orchard-gateway")
    scheduler = _component(docs, "orchard-scheduler")
    proxy = _component(docs, "orchard-egress-proxy")
    stranger = Pod("default", {"app": "anything"}, ip="10.3.0.7")
    same_ns_stranger = Pod(RELEASE_NS, {"app": "debug"}, ip="10.1.0.99")
    fake_gateway = Pod("default", dict(gateway.labels), ip="10.3.0.8")  # labels, other ns
    sandboxes = [_sandbox(c) for c in ("none", "allowlist", "internet")]
    # The scheduler's gRPC port: the gateway, nobody else.
    assert connects(docs, gateway, scheduler, 50052)
    for pod in [stranger, same_ns_stranger, fake_gateway, proxy, *sandboxes]:
        assert not connects(docs, pod, scheduler, 50052), pod
    assert not connects(docs, gateway, scheduler, 9091)  # metrics: only metricsFrom peers
    # The egress proxy: only allowlist sandboxes, only on its port.
    allowlist = sandboxes[1]
    assert connects(docs, allowlist, proxy, 3128)
    assert not connects(docs, allowlist, proxy, 5353)
    for pod in [stranger, same_ns_stranger, gateway, scheduler, sandboxes[0], sandboxes[2]]:
        assert not connects(docs, pod, proxy, 3128), pod
    # No sandbox reaches the gateway's ports (the public API is for trainers, not tasks).
    for pod in sandboxes:
        for port in (50051, 8080, 50060):
            assert not connects(docs, pod, gateway, port), (pod, port)
    # DNS: only class internet resolves (allowlist sandboxes name hosts to the proxy).
    dns = Pod("kube-system", {"k8s-app": "kube-dns"}, ip="10.0.0.10")
    assert [connects(docs, pod, dns, 53) for pod in sandboxes] == [False, False, True]
    # The gateway's public ports are open to the rest; its metrics and health ports are not.
    assert connects(docs, stranger, gateway, 50051) and connects(docs, stranger, gateway, 8080)
    assert not connects(docs, stranger, gateway, 9090)
    assert not connects(docs, stranger, gateway, 50060)


def test_the_egress_proxy_reaches_only_the_internet_and_dns() -> None:
    docs = render({"sandboxes": {"clusterCIDRs": ["100.96.0.0/11"]}})
    proxy = _component(docs, "orchard-egress-proxy")
    for ip in ("10.1.0.5", "192.168.1.1", "169.254.169.254", "100.96.0.1", "172.16.0.1"):
        assert not connects(docs, proxy, Pod("elsewhere", {}, ip=ip), 443), ip
    assert connects(docs, proxy, Pod("internet", {}, ip="93.184.216.34"), 443)
    dns = Pod("kube-system", {"k8s-app": "kube-dns"}, ip="10.0.0.10")
    assert connects(docs, proxy, dns, 53)
    assert not connects(docs, proxy, _component(docs, "orchard-scheduler"), 50052)


def test_metrics_are_reachable_from_the_named_peers_only() -> None:
    monitoring = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "mon"}}}
    docs = render({"networkPolicies": {"metricsFrom": [monitoring]}})
    prometheus = Pod("mon", {"app": "prometheus"})
    for name, port in (("orchard-gateway", 9090), ("orchard-scheduler", 9091)):
        assert connects(docs, prometheus, _component(docs, name), port)
        assert not connects(docs, Pod("default", {}), _component(docs, name), port)
    assert not connects(docs, prometheus, _component(docs, "orchard-scheduler"), 50052)


def test_network_policies_can_be_left_to_the_cluster_admin() -> None:
    docs = render({"networkPolicies": {"enabled": False}})
    assert not [
        d for d in docs if d["kind"] == "NetworkPolicy" and d["metadata"]["namespace"] == RELEASE_NS
    ]


# ---- egress proxy caps --------------------------------------------------------------


def _proxy_limits(docs: list[Doc], monkeypatch: pytest.MonkeyPatch) -> EgressLimits:
    container = _deployment(docs, "orchard-egress-proxy")["spec"]["template"]["spec"]["containers"][
        0
    ]
    for env in container["env"]:
        monkeypatch.setenv(env["name"], env["value"])
    return EgressLimits.from_env()


def test_the_charts_egress_caps_are_the_proxys(monkeypatch: pytest.MonkeyPatch) -> None:
    """The chart's defaults are the code's, and a value reaches the proxy's own parser."""
    assert _proxy_limits(render(), monkeypatch) == EgressLimits()
    docs = render({"egressProxy": {"limits": {"connectionsPerTenant": 300}}})
    assert _proxy_limits(docs, monkeypatch).max_connections_per_tenant == 300
    docs = render({"egressProxy": {"limits": {"connectionsPerTenant": 100}}})
    with pytest.raises(ValueError, match="max_connections <= max_connections_per_tenant"):
        _proxy_limits(docs, monkeypatch)


def test_metrics_ports_need_the_rendered_token() -> None:
    """Every Deployment serving /metrics reads the scrape token from the chart's Secret
    (ORCHARD_METRICS_TOKEN_FILE on a read-only mount), and the Secret holds a real token;
    metrics.existingSecret replaces it."""
    docs = render()
    secret = next(
        d
        for d in docs
        if d["kind"] == "Secret" and d["metadata"]["name"] == "orchard-metrics-token"
    )
    token = base64.b64decode(secret["data"]["token"]).decode()
    assert len(token) >= 32 and token.isalnum()
    served = 0
    for doc in docs:
        if doc["kind"] != "Deployment":
            continue
        pod = doc["spec"]["template"]["spec"]
        for container in pod["containers"]:
            if not any(str(a).startswith("--metrics-listen") for a in container.get("args", [])):
                continue
            served += 1
            env = {e["name"]: e.get("value") for e in container.get("env", [])}
            assert env["ORCHARD_METRICS_TOKEN_FILE"] == "/etc/orchard/metrics/token"
            mount = next(m for m in container["volumeMounts"] if m["name"] == "metrics-token")
            assert mount["mountPath"] == "/etc/orchard/metrics" and mount["readOnly"]
            volume = next(v for v in pod["volumes"] if v["name"] == "metrics-token")
            assert volume["secret"]["secretName"] == "orchard-metrics-token"
    assert served == 2  # gateway and scheduler
    mine = render({"metrics": {"existingSecret": "my-scrape-token"}})
    assert not [d for d in mine if d["metadata"]["name"] == "orchard-metrics-token"]
    volumes = [
        v
        for d in mine
        if d["kind"] == "Deployment"
        for v in d["spec"]["template"]["spec"]["volumes"]
        if v["name"] == "metrics-token"
    ]
    assert [v["secret"]["secretName"] for v in volumes] == ["my-scrape-token"] * 2
