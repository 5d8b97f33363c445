"""One real stack per test module, and the environment that points the SDK at it.

The adapters build their clients the way users' code does (``AsyncOrchard()``
from ``ORCHARD_ENDPOINT`` / ``ORCHARD_API_KEY``), so the fixture sets those.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from tests.stack import Stack, running_stack


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    with running_stack(tmp_path_factory.mktemp("stack") / "home") as running:
        key = (running.home / "dev-api-key").read_text().strip()
        saved = {k: os.environ.get(k) for k in ("ORCHARD_ENDPOINT", "ORCHARD_API_KEY")}
        os.environ["ORCHARD_ENDPOINT"] = running.endpoint
        os.environ["ORCHARD_API_KEY"] = key
        try:
            yield running
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
