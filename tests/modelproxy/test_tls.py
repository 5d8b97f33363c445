"""The proxy started with the Helm chart's own arguments (rendered by Helm's engine; the
Secrets' files made by a local CA and the addresses moved to loopback): it serves HTTPS,
asks a ``grpcs://`` gateway (a TLS stand-in answering ``GetTenant``, as in the other tests)
trusting the mounted CA, and the real ``openai`` client that trusts the CA gets its answer;
plaintext to the same port gets none."""

from __future__ import annotations

import ssl
from pathlib import Path

import httpx2
import openai
import pytest

from orchard.common.local_ca import LocalCA
from orchard.common.tls import ServerTLS
from orchard.testing.scripted_model import scripted_upstream
from tests.kubernetes.test_helm_chart import render

from .conftest import start_proxy, stop_proxy
from .tenant_gateway import tenant_gateway

_MOVED = ("--home=", "--listen=", "--upstream=", "--gateway=", "--public-url=")
"""What start_proxy sets itself (loopback, the test's home, gateway and upstream)."""


def _chart_args(tmp_path: Path, ca: LocalCA) -> list[str]:
    docs = render({"modelProxy": {"enabled": True, "upstream": {"kind": "vllm"}}})
    deployment = next(d for d in docs if d["metadata"]["name"] == "orchard-modelproxy")
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    mounted = {"/etc/orchard/tls/tls.crt": ca.cert_file, "/etc/orchard/tls/tls.key": ca.key_file,
               "/etc/orchard/gateway-ca/ca.crt": ca.ca_file}  # fmt: skip
    args = []
    for arg in container["args"][3:]:
        if arg.startswith(_MOVED):
            continue
        flag, _, value = arg.partition("=")
        args.append(f"{flag}={mounted.get(value, value)}")
    assert {a.split("=")[0] for a in args} >= {"--tls-cert", "--tls-key", "--gateway-ca"}
    return args


def test_the_charts_proxy_serves_https_and_asks_a_tls_gateway(tmp_path: Path) -> None:
    ca = LocalCA.of_home(tmp_path)
    ca.ensure(["localhost"])
    gateway_tls = ServerTLS.load(ca.cert_file, ca.key_file).grpc_credentials()
    home = tmp_path / "home"
    home.mkdir()
    with (
        scripted_upstream([{"content": "hello over https"}]) as (_server, url),
        tenant_gateway({"key-alice": "alice"}, tls=gateway_tls) as gateway,
    ):
        assert gateway.startswith("grpcs://")
        proxy = start_proxy(home, url, gateway, *_chart_args(tmp_path, ca))
        try:
            assert proxy.url.startswith("https://127.0.0.1:"), proxy.url
            trust = ssl.create_default_context(cafile=str(ca.ca_file))
            with httpx2.Client(verify=trust, timeout=30) as http:
                made = http.post(f"{proxy.url}/v1/sessions", json={},
                                 headers={"Authorization": "Bearer key-alice"})  # fmt: skip
                assert made.status_code == 200, made.text
                assert made.json()["tenant"] == "alice"  # GetTenant answered over grpcs://
                refused = http.post(f"{proxy.url}/v1/sessions", json={},
                                    headers={"Authorization": "Bearer key-mallory"})  # fmt: skip
                assert refused.status_code == 401, refused.text
                client = openai.OpenAI(base_url=made.json()["openai_base_url"], api_key="x",
                                       max_retries=0, http_client=http)  # fmt: skip
                answer = client.chat.completions.create(
                    model="m", messages=[{"role": "user", "content": "hi"}]
                )
                assert answer.choices[0].message.content == "hello over https"
            plain = "http://" + proxy.url.removeprefix("https://")
            with pytest.raises(httpx2.HTTPError), httpx2.Client(timeout=10) as http:
                http.post(f"{plain}/v1/sessions", json={},
                          headers={"Authorization": "Bearer key-alice"})  # fmt: skip
        finally:
            stop_proxy(proxy)
