"""Per-pool pod settings (the chart's pods.json) reach the Kubernetes backend.

The chart renders pods.json (Helm's own engine, offline, as in test_helm_chart)
and mounts it at ``<home>/pods.json``; the scheduler's ``registry.load_backend`` reads it
through ``KubernetesSettings.from_env``. The pods are checked on a FAKE API
server on loopback (tests/kubernetes/fake_apiserver.py; no cluster runs here),
driven by the real ``kubernetes`` client.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from orchard.scheduler.backends.base import BackendError
from orchard.scheduler.backends.kubernetes import KubernetesBackend, KubernetesSettings
from orchard.scheduler.backends.kubernetes.pod_settings import (
    PodSettingsError,
    load_pod_settings,
    parse_pod_settings,
)
from orchard.scheduler.backends.registry import load_backend
from orchard.scheduler.settings import SchedulerSettings

from . import lifecycle
from .conftest import NAMESPACE
from .fake_apiserver import FakeApiServer
from .test_helm_chart import OVERRIDES, render

pytestmark = pytest.mark.timeout(60)

PLAIN_POOL = {
    "name": "plain",
    "image": "debian:bookworm-slim",
    "cpuMillis": 500,
    "memoryBytes": 536870912,
    "network": "none",
    "min": 0,
    "max": 2,
}
VALUES: dict[str, Any] = {**OVERRIDES, "pools": [*OVERRIDES["pools"], PLAIN_POOL]}


def rendered_pods_json(values: dict[str, Any]) -> str:
    (cm,) = [d for d in render(values) if d["kind"] == "ConfigMap"]
    return str(cm["data"]["pods.json"])


@pytest.fixture(scope="module")
def chart_pods_json() -> str:
    return rendered_pods_json(VALUES)


def test_the_rendered_charts_pods_json_parses(chart_pods_json: str) -> None:
    pools = parse_pod_settings(json.loads(chart_pods_json))
    assert set(pools) == {"swe-spot", "plain"}
    spot = pools["swe-spot"]
    assert spot.runtime_class_name == "gvisor"
    assert (spot.run_as_non_root, spot.run_as_user) == (True, 65532)
    assert spot.node_selector == {"orchard.dev/capacity": "spot"}
    assert [t["key"] for t in spot.tolerations] == ["orchard.dev/spot"]
    plain = pools["plain"]
    assert (plain.node_selector, plain.tolerations, plain.runtime_class_name) == ({}, (), "")
    assert not plain.run_as_non_root
    # The chart's defaults parse too.
    assert set(parse_pod_settings(json.loads(rendered_pods_json({})))) == {"py-small"}


def test_from_env_reads_home_pods_json_or_the_named_file(
    chart_pods_json: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("ORCHARD_K8S_POD_SETTINGS", raising=False)
    assert KubernetesSettings.from_env(tmp_path).templates == {}  # no file: no pools
    (tmp_path / "pods.json").write_text(chart_pods_json)
    assert set(KubernetesSettings.from_env(tmp_path).templates) == {"swe-spot", "plain"}
    other = tmp_path / "elsewhere.json"
    other.write_text('{"only": {"runtime_class_name": "kata"}}')
    monkeypatch.setenv("ORCHARD_K8S_POD_SETTINGS", str(other))
    templates = KubernetesSettings.from_env(tmp_path).templates
    assert list(templates) == ["only"] and templates["only"].runtime_class_name == "kata"
    monkeypatch.setenv("ORCHARD_K8S_POD_SETTINGS", str(tmp_path / "missing.json"))
    with pytest.raises(PodSettingsError, match=r"missing\.json: cannot read"):
        KubernetesSettings.from_env(tmp_path)


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("[1, 2]", "must be an object of pools by name"),
        ("{not json", "not JSON"),
        ('{"Bad Name": {}}', "pool name 'Bad Name' is not a valid name"),
        ('{"p": []}', "pool 'p': must be an object"),
        ('{"p": {"spot": true}}', "pool 'p': unknown field 'spot'"),
        ('{"p": {"run_as_non_root": "yes"}}', "pool 'p': run_as_non_root must be true or false"),
        ('{"p": {"run_as_non_root": true}}', "pool 'p': run_as_user must be a non-zero uid"),
        ('{"p": {"run_as_user": -1}}', "pool 'p': run_as_user must be in"),
        ('{"p": {"run_as_user": "1000"}}', "pool 'p': run_as_user must be an integer"),
        ('{"p": {"runtime_class_name": "G Visor"}}', "pool 'p': runtime_class_name 'G Visor'"),
        ('{"p": {"network_class": "open"}}', "pool 'p': network_class 'open' is not one of"),
        ('{"p": {"node_selector": ["spot"]}}', "pool 'p': node_selector must be an object"),
        ('{"p": {"node_selector": {"a": 1}}}', "node_selector['a'] 1 is not a label value"),
        ('{"p": {"node_selector": {"-x": "1"}}}', "node_selector key '-x' is not a label key"),
        ('{"p": {"tolerations": {"key": "a"}}}', "pool 'p': tolerations must be a list"),
        ('{"p": {"tolerations": [{"key": "a", "operator": "In"}]}}', "tolerations[0]: operator"),
        ('{"p": {"tolerations": [{"effect": "Never"}]}}', "tolerations[0]: effect 'Never'"),
        ('{"p": {"tolerations": [{"key": "a", "colour": "x"}]}}', "unknown field 'colour'"),
        (
            '{"p": {"tolerations": [{"key": "a", "operator": "Exists", "value": "v"}]}}',
            "value must be empty with operator Exists",
        ),
        (
            '{"p": {"tolerations": [{"key": "a", "tolerationSeconds": 5}]}}',
            "tolerationSeconds needs effect NoExecute",
        ),
    ],
)
def test_invalid_pod_settings_name_the_pool_and_field(
    content: str, message: str, tmp_path: Path
) -> None:
    path = tmp_path / "pods.json"
    path.write_text(content)
    with pytest.raises(PodSettingsError) as err:
        load_pod_settings(path)
    assert message in str(err.value)
    assert str(path) in str(err.value)


def test_load_backend_refuses_a_bad_pods_json_with_a_clear_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("ORCHARD_K8S_POD_SETTINGS", raising=False)
    (tmp_path / "pods.json").write_text('{"p": {"network_class": "open"}}')
    with pytest.raises(BackendError, match=r"kubernetes backend: .*network_class 'open'") as err:
        load_backend("kubernetes", SchedulerSettings(home=tmp_path))
    assert err.value.client_fault


def test_a_pools_spot_and_runtime_class_settings_show_up_in_its_pods(
    fake_api: FakeApiServer,
    chart_pods_json: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The scheduler's path: orchard home with the chart's pods.json, settings from env.
    (tmp_path / "pods.json").write_text(chart_pods_json)
    monkeypatch.delenv("ORCHARD_K8S_POD_SETTINGS", raising=False)
    monkeypatch.setenv("ORCHARD_K8S_API_HOST", fake_api.url)
    monkeypatch.setenv("ORCHARD_K8S_NAMESPACE", NAMESPACE)
    backend = load_backend("kubernetes", SchedulerSettings(home=tmp_path))
    assert isinstance(backend, KubernetesBackend)

    async def scenario() -> tuple[dict[str, Any], dict[str, Any]]:
        await backend.start()
        try:
            spot_id, plain_id = lifecycle.new_id(), lifecycle.new_id()
            # runtime_class "" in the spec: the RuntimeClass can only come from pods.json.
            for sid, pool in ((spot_id, "swe-spot"), (plain_id, "plain")):
                await backend.create_pod(
                    lifecycle.small_spec(sid), tenant="t", ttl_seconds=60, template=pool
                )
            spot, plain = fake_api.pod(NAMESPACE, spot_id), fake_api.pod(NAMESPACE, plain_id)
            assert spot is not None and plain is not None
            for sid in (spot_id, plain_id):
                await backend.delete(sid)
            return spot, plain
        finally:
            await backend.close()

    spot, plain = asyncio.run(scenario())
    spec = spot["spec"]
    assert spec["runtimeClassName"] == "gvisor"
    assert spec["nodeSelector"] == {"orchard.dev/capacity": "spot"}
    assert spec["tolerations"] == json.loads(chart_pods_json)["swe-spot"]["tolerations"]
    assert spec["tolerations"][0]["key"] == "orchard.dev/spot"
    assert spec["securityContext"]["runAsNonRoot"] is True
    assert spec["securityContext"]["runAsUser"] == 65532
    assert spot["metadata"]["labels"]["orchard.dev/pool"] == "swe-spot"
    assert "runtimeClassName" not in plain["spec"] and "nodeSelector" not in plain["spec"]
    assert "tolerations" not in plain["spec"]
