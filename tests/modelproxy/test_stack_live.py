"""The model proxy as ``orchard up`` starts it, judged by the real gateway: the dev tenant's
key makes a session, a made-up key and a revoked tenant's key are refused, and a harness's
Chat call through the session URL reaches the scripted upstream and is recorded."""

from __future__ import annotations

import json
import ssl
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import httpx2
import openai
import pytest

from orchard.testing.scripted_model import scripted_upstream
from tests.stack import REQUIRES_STACK, running_stack

pytestmark = REQUIRES_STACK


def _post(url: str, key: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    request = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST")
    request.add_header("Authorization", f"Bearer {key}")
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


def test_orchard_up_serves_the_model_proxy_behind_the_gateways_keys(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    with (
        scripted_upstream([{"content": "hello from the model"}]) as (server, url),
        running_stack(home, up_args=["--model-upstream", url]) as stack,
    ):
        proxy = (home / "run" / "modelproxy.addr").read_text().strip()
        assert proxy.startswith("http://127.0.0.1:")
        dev_key = (home / "dev-api-key").read_text().strip()
        status, session = _post(f"{proxy}/v1/sessions", dev_key, {"model_version": "v0"})
        assert status == 200 and session["tenant"] == "dev", session
        status, refused = _post(f"{proxy}/v1/sessions", "ork_not-a-key", {})
        assert status == 401 and refused["error"]["code"] == "API_KEY_INVALID"
        made = subprocess.run(
                [sys.executable, "-m", "orchard.cli", "tenant", "--home", str(home), "create", "eve"],
                capture_output=True, text=True, timeout=60, env=stack.env, check=True,
            )  # fmt: skip
        eve_key = made.stdout.strip()
        subprocess.run(
                [sys.executable, "-m", "orchard.cli", "tenant", "--home", str(home), "revoke", "eve"],
                capture_output=True, text=True, timeout=60, env=stack.env, check=True,
            )  # fmt: skip
        # the proxy keeps no keys: a revoked tenant is refused by the gateway's word (a key
        # it accepted before stays trusted for its key-cache minute, as in the rewards service)
        assert _post(f"{proxy}/v1/sessions", eve_key, {})[0] == 401
        client = openai.OpenAI(base_url=session["openai_base_url"], api_key="x", max_retries=0)
        answer = client.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "hi"}]
        )
        assert answer.choices[0].message.content == "hello from the model"
        assert server.requests[0]["return_token_ids"] is True
        with pytest.raises(openai.AuthenticationError):
            openai.OpenAI(base_url=session["openai_base_url"][:-5] + "x/v1", api_key="x",
                              max_retries=0).chat.completions.create(
                    model="m", messages=[{"role": "user", "content": "hi"}])  # fmt: skip
        calls = json.loads((home / "modelproxy" / "sessions" / session["id"] / "calls.jsonl")
                               .read_text().splitlines()[0])  # fmt: skip
        assert calls["completion_token_ids"] and calls["model_version"] == "v0"


def test_orchard_up_tls_serves_the_model_proxy_over_https_with_the_local_ca(
    tmp_path: Path,
) -> None:
    """Under ``--tls`` the proxy presents the node's certificate: the real ``openai`` client
    trusting ``run/ca.pem`` reaches it, a plaintext HTTP request to the same port does not."""
    home = tmp_path / "home"
    home.mkdir()
    with (
        scripted_upstream([{"content": "hello over tls"}]) as (_server, url),
        running_stack(home, up_args=["--tls", "--model-upstream", url]),
    ):
        proxy = (home / "run" / "modelproxy.addr").read_text().strip()
        assert proxy.startswith("https://127.0.0.1:"), proxy
        trust = ssl.create_default_context(cafile=str(home / "run" / "ca.pem"))
        dev_key = (home / "dev-api-key").read_text().strip()
        with httpx2.Client(verify=trust, timeout=30) as http:
            made = http.post(f"{proxy}/v1/sessions", json={"model_version": "v1"},
                             headers={"Authorization": f"Bearer {dev_key}"})  # fmt: skip
            assert made.status_code == 200, made.text
            session = made.json()
            assert session["openai_base_url"].startswith(proxy + "/s/")
            client = openai.OpenAI(base_url=session["openai_base_url"], api_key="x",
                                   max_retries=0, http_client=http)  # fmt: skip
            answer = client.chat.completions.create(
                model="m", messages=[{"role": "user", "content": "hi"}]
            )
            assert answer.choices[0].message.content == "hello over tls"
        # the same port, spoken to in plaintext: aiohttp's TLS listener drops it, no answer
        plain = "http://" + proxy.removeprefix("https://")
        with pytest.raises(httpx2.HTTPError), httpx2.Client(timeout=10) as http:
            http.post(
                f"{plain}/v1/sessions", json={}, headers={"Authorization": f"Bearer {dev_key}"}
            )
        # and a client that trusts only the system's roots refuses the local CA's certificate
        with pytest.raises(openai.APIConnectionError):
            openai.OpenAI(base_url=session["openai_base_url"], api_key="x", max_retries=0,
                          timeout=10).chat.completions.create(
                model="m", messages=[{"role": "user", "content": "hi"}])  # fmt: skip
