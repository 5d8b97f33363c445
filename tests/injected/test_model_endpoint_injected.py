"""The model endpoint of an injected sandbox (its own executor, runc): the local backend makes
the listener in the container's namespace as for a node-executor sandbox, and a command run
by the executor *inside* the sandbox reaches the stand-in model proxy through it.

Real parts: runc, the executor bundle serving inside the sandbox, the Debian image's
python3; the model proxy is a small real HTTP server on the host's loopback
(``tests.network.test_model_endpoint_relay``), so this test needs no stack.
"""

from __future__ import annotations

import asyncio
import functools
import json
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from orchard.executor.initbin import ensure_init_binary
from orchard.scheduler.backends.base import SandboxSpec
from orchard.scheduler.backends.local import injected
from orchard.scheduler.backends.local.backend import LocalBackend
from orchard.scheduler.backends.local.model_endpoint import ModelEndpointSettings
from orchard.scheduler.backends.local.settings import DEFAULT_IMAGE, LocalSettings

from tests.executor.harness import Client
from tests.network.test_model_endpoint_relay import model_proxy_stand_in

from .conftest import close_node

pytestmark = pytest.mark.runc

CALL = (
    "import json, os, urllib.request; "
    "r = urllib.request.urlopen(urllib.request.Request(os.environ['ORCHARD_MODEL_BASE'] + "
    "'/s/cred/v1/chat/completions', data=b'{}'), timeout=20); print(r.read().decode())"
)


@pytest.fixture
def port() -> Iterator[int]:
    with model_proxy_stand_in() as listening:
        yield listening


def test_an_injected_sandbox_reaches_the_proxy_through_its_endpoint(
    images_dir: Path, bundle: Path, port: int
) -> None:
    home = Path(tempfile.mkdtemp(prefix="oe-inj-ep-", dir="/tmp"))
    settings = LocalSettings(
        home=home,
        images_dir=images_dir,
        init_binary=ensure_init_binary(),
        executor_bundle=bundle,
        model_endpoint=ModelEndpointSettings(target=f"127.0.0.1:{port}"),
    )
    loop = asyncio.new_event_loop()
    backend = LocalBackend(settings)
    try:
        spec = SandboxSpec(sandbox_id="sb-inj-model1", image=DEFAULT_IMAGE, model_endpoint=True)
        loop.run_until_complete(backend.create(spec))
        address = injected.executor_address(backend.layout.sandbox(spec.sandbox_id))
        client = Client(address, home)
        try:
            # the relay runs on the backend's loop: keep it running while the command does
            ran = loop.run_until_complete(
                loop.run_in_executor(
                    None,
                    functools.partial(
                        client.run, spec.sandbox_id, argv=["python3", "-c", CALL], timeout=60
                    ),
                )
            )
        finally:
            client.close()
        assert ran.status.exit_code == 0, ran.stderr
        assert json.loads(ran.stdout) == {"path": "/s/cred/v1/chat/completions", "got": 2}
        stats = backend.model_endpoints.stats(spec.sandbox_id)
        assert stats is not None and stats.connections == 1 and stats.bytes_to_sandbox > 0
        loop.run_until_complete(backend.delete(spec.sandbox_id))
        assert not backend.model_endpoints.is_open(spec.sandbox_id)
    finally:
        close_node(loop, backend, home)
