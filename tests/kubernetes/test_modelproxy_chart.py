"""The recording model proxy in the Helm chart (``modelProxy``), rendered by Helm's real engine:
its Deployment's arguments are the ones the proxy's own parser takes (with the Secrets'
files projected where the chart mounts them), its Service selects its pod, and its
NetworkPolicies let in sandboxes and tenants' trainers and let out only the gateway, the
upstream and DNS (checked with the NetworkPolicy evaluator of ``test_chart_security``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from helm_python.chart import lint
from orchard.modelproxy.__main__ import parse_args

from orchard.common.local_ca import LocalCA

from .schemas import KUBERNETES_VERSIONS, schema_errors
from .test_chart_security import Pod, _component, _sandbox, connects
from .test_helm_chart import CHART, RELEASE_NS, TENANTS, render

Doc = dict[str, Any]

TRAINERS = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "trainers"}}}
VLLM = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "vllm"}}}
ENABLED: dict[str, Any] = {
    "modelProxy": {
        "enabled": True,
        "upstream": {
            "url": "http://vllm.vllm.svc:8000/v1", "kind": "sglang",
            "apiKeySecret": {"name": "vllm-key", "key": "token"}, "to": [VLLM], "port": 8000,
        },
        "clientsFrom": [TRAINERS],
    }
}  # fmt: skip


def _of(docs: list[Doc], kind: str, name: str) -> Doc:
    return next(d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name)


def _proxy_pod(docs: list[Doc]) -> Doc:
    return dict(_of(docs, "Deployment", "orchard-modelproxy")["spec"]["template"]["spec"])


def test_the_proxy_is_off_by_default() -> None:
    docs = render({})
    assert not [d for d in docs if "modelproxy" in d["metadata"]["name"]]


def test_the_chart_starts_the_proxy_with_arguments_its_parser_takes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    docs = render(ENABLED)
    pod = _proxy_pod(docs)
    container = pod["containers"][0]
    assert container["args"][:3] == ["python", "-m", "orchard.modelproxy"]
    # Project the Secrets where the chart mounts them (a local CA stands in for cert-manager).
    ca = LocalCA.of_home(tmp_path)
    ca.ensure(["orchard-modelproxy.orchard.svc"])
    volumes = {v["name"]: v for v in pod["volumes"]}
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    files = {"tls": {"tls.crt": ca.cert_file, "tls.key": ca.key_file},
             "gateway-ca": {"ca.crt": ca.ca_file}}  # fmt: skip
    root = tmp_path / "pod"
    args = container["args"][3:]
    for name, sources in files.items():
        assert {i["path"] for i in volumes[name]["secret"]["items"]} == set(sources)
        folder = root / mounts[name].lstrip("/")
        folder.mkdir(parents=True)
        for path, source in sources.items():
            (folder / path).write_bytes(source.read_bytes())
        args = [a.replace(f"={mounts[name]}/", f"={folder}/") for a in args]
    assert volumes["tls"]["secret"]["secretName"] == "orchard-modelproxy-tls"
    assert volumes["gateway-ca"]["secret"]["secretName"] == "orchard-gateway-tls"
    assert mounts["home"] == "/var/lib/orchard" and "emptyDir" in volumes["home"]
    # The upstream key comes from the named Secret, in the variable the proxy reads.
    env = {e["name"]: e for e in container["env"]}
    ref = env["ORCHARD_MODEL_UPSTREAM_API_KEY"]["valueFrom"]["secretKeyRef"]
    assert ref == {"name": "vllm-key", "key": "token"}
    monkeypatch.setenv("ORCHARD_MODEL_UPSTREAM_API_KEY", "sk-upstream")
    for name in ("ORCHARD_MODEL_UPSTREAM", "ORCHARD_MODEL_UPSTREAM_KIND", "ORCHARD_TLS_CA",
                 "ORCHARD_TLS_CERT", "ORCHARD_TLS_KEY", "ORCHARD_TLS_CLIENT_CA"):  # fmt: skip
        monkeypatch.delenv(name, raising=False)
    settings, extra = parse_args(args)
    assert settings.listen == "0.0.0.0:50090" and extra == {}
    assert settings.upstream == "http://vllm.vllm.svc:8000/v1"
    assert settings.upstream_kind == "sglang" and settings.upstream_api_key == "sk-upstream"
    assert settings.gateway == f"grpcs://orchard-gateway.{RELEASE_NS}.svc:50051"
    assert settings.gateway_ca is not None and settings.gateway_ca.read_bytes() == (
        ca.ca_file.read_bytes()
    )
    assert settings.tls is not None and settings.tls.cert_pem == ca.cert_file.read_bytes()
    assert settings.public_url == f"https://orchard-modelproxy.{RELEASE_NS}.svc:50090"
    assert settings.max_body_bytes == 8 * 1024 * 1024 and settings.max_calls_per_session == 10_000
    assert settings.home == Path("/var/lib/orchard")


def test_the_service_selects_the_proxy_on_its_port() -> None:
    docs = render(ENABLED)
    deployment = _of(docs, "Deployment", "orchard-modelproxy")
    service = _of(docs, "Service", "orchard-modelproxy")
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert deployment["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert service["spec"]["selector"].items() <= labels.items()
    # No other Deployment's pods carry the Service's selector.
    for other in (d for d in docs if d["kind"] == "Deployment" and d is not deployment):
        assert not service["spec"]["selector"].items() <= (
            other["spec"]["template"]["metadata"]["labels"].items()
        ), other["metadata"]["name"]
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    [port] = service["spec"]["ports"]
    assert port["port"] == 50090 and ports[port["targetPort"]] == 50090
    # No health route: both probes check the served port accepts connections.
    for probe in ("readinessProbe", "livenessProbe"):
        assert ports[container[probe]["tcpSocket"]["port"]] == 50090
    resources = container["resources"]
    assert resources["limits"] == resources["requests"] and resources["limits"]["memory"]
    assert deployment["spec"]["replicas"] == 1
    assert deployment["spec"]["strategy"]["type"] == "Recreate"


def test_a_plaintext_gateway_and_proxy_are_values() -> None:
    values = {**ENABLED, "gateway": {"tls": {"enabled": False}}}
    values["modelProxy"] = {**ENABLED["modelProxy"], "tls": {"enabled": False},
                            "persistence": {"existingClaim": "recordings"}}  # fmt: skip
    pod = _proxy_pod(render(values))
    args = pod["containers"][0]["args"]
    assert f"--gateway=orchard-gateway.{RELEASE_NS}.svc:50051" in args
    assert not any(a.startswith(("--tls", "--gateway-ca")) for a in args)
    assert f"--public-url=http://orchard-modelproxy.{RELEASE_NS}.svc:50090" in args
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert set(volumes) == {"home"}
    assert volumes["home"]["persistentVolumeClaim"] == {"claimName": "recordings"}


def test_the_chart_refuses_what_the_proxy_could_not_use() -> None:
    with pytest.raises(Exception, match="clientCASecret"):
        render({**ENABLED, "gateway": {"tls": {"clientCASecret": "trainers-ca"}}})
    with pytest.raises(Exception, match="no network class"):
        render({"modelProxy": {**ENABLED["modelProxy"], "fromSandboxNetworks": ["open"]}})


def test_sandboxes_and_trainers_reach_the_proxy_which_reaches_only_gateway_upstream_dns() -> None:
    docs = render(ENABLED)
    proxy = _component(docs, "orchard-modelproxy")
    gateway = _component(docs, "orchard-gateway")
    scheduler = _component(docs, "orchard-scheduler")
    trainer = Pod("trainers", {"app": "trainer"}, ip="10.4.0.2")
    vllm = Pod("vllm", {"app": "vllm"}, ip="10.5.0.3")
    stranger = Pod("default", {"app": "anything"}, ip="10.3.0.7")
    same_ns_stranger = Pod(RELEASE_NS, {"app": "debug"}, ip="10.1.0.99")
    dns = Pod("kube-system", {"k8s-app": "kube-dns"}, ip="10.0.0.10")
    internet = Pod("elsewhere", {}, ip="203.0.113.9")
    sandboxes = [_sandbox(c) for c in ("none", "allowlist", "internet")]
    # In: every sandbox class (its harness calls its model) and the trainers, one port.
    for pod in [*sandboxes, trainer]:
        assert connects(docs, pod, proxy, 50090), pod
        assert not connects(docs, pod, proxy, 50091), pod
    for pod in [stranger, same_ns_stranger, vllm, scheduler]:
        assert not connects(docs, pod, proxy, 50090), pod
    # Out: the gateway's gRPC port, the upstream's port, DNS; not the scheduler, not the rest.
    assert connects(docs, proxy, gateway, 50051)
    assert connects(docs, proxy, vllm, 8000) and not connects(docs, proxy, vllm, 22)
    assert connects(docs, proxy, dns, 53)
    for pod, port in ((scheduler, 50052), (internet, 443), (stranger, 8000), (gateway, 8080)):
        assert not connects(docs, proxy, pod, port), (pod, port)
    for pod in sandboxes:  # the sandboxes' extra egress opens the proxy only
        assert not connects(docs, pod, gateway, 50051)
        assert not connects(docs, pod, vllm, 8000)
    assert [connects(docs, pod, dns, 53) for pod in sandboxes] == [False, False, True]


def test_sandbox_classes_left_out_do_not_reach_the_proxy() -> None:
    values = {"modelProxy": {**ENABLED["modelProxy"], "fromSandboxNetworks": ["internet"]}}
    docs = render(values)
    proxy = _component(docs, "orchard-modelproxy")
    reach = [connects(docs, _sandbox(c), proxy, 50090) for c in ("none", "allowlist", "internet")]
    assert reach == [False, False, True]


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_the_proxys_objects_match_the_schema(version: str) -> None:
    for doc in render(ENABLED):
        assert schema_errors(doc, version) == [], doc["metadata"]["name"]


def test_helm_lint_has_no_errors_with_the_proxy() -> None:
    assert lint(str(CHART), {**TENANTS, **ENABLED})["errors"] == []
