"""The same lifecycle scenarios against a real cluster, when ``KUBECONFIG`` is set.

Needs: the sandbox namespace (``ORCHARD_K8S_NAMESPACE``, default
orchard-sandboxes) with the ``orchard-executor-token`` Secret, the executor
bundle image pullable (``ORCHARD_K8S_BUNDLE_IMAGE``), and rights to manage pods
there (the chart's scheduler Role). Without ``KUBECONFIG`` these tests skip with
a reason starting with "optional:", which the strict suite lets through.
"""

from __future__ import annotations

import asyncio
import os
import secrets

import pytest
from orchard.scheduler.backends.kubernetes import KubernetesBackend, KubernetesSettings, PodTemplate

from orchard.common.tokens import Keyring

from . import lifecycle

pytestmark = [
    pytest.mark.skipif(
        not os.environ.get("KUBECONFIG"),
        reason="optional: set KUBECONFIG to run the Kubernetes e2e suite against a real cluster",
    ),
    pytest.mark.timeout(600),
]


def _settings() -> KubernetesSettings:
    env = KubernetesSettings.from_env()
    return KubernetesSettings(
        namespace=env.namespace,
        kubeconfig=env.kubeconfig,
        bundle_image=env.bundle_image,
        default_image=env.default_image,
        ready_timeout_seconds=300.0,
        templates={"e2e": PodTemplate(name="e2e", cpu_millis=250, memory_bytes=256 << 20)},
    )


async def _make() -> KubernetesBackend:
    backend = KubernetesBackend(_settings(), keyring=Keyring.single(secrets.token_bytes(32)))
    await backend.start()
    return backend


def test_create_list_recover_delete_on_a_cluster() -> None:
    asyncio.run(lifecycle.create_list_recover_delete(_make))


def test_concurrent_claims_on_a_cluster() -> None:
    asyncio.run(lifecycle.concurrent_claims_never_share(_make, "e2e", members=2, claimers=6))
