from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from orchard import Orchard
from orchard.testing import FakeOrchard, FakeTemplate


@pytest.fixture
def fake(tmp_path: Path) -> Iterator[FakeOrchard]:
    with FakeOrchard(
        base_dir=tmp_path,
        images=["debian", "python:3.12"],
        templates=[FakeTemplate("py-small", image="python:3.12", max=4)],
    ) as fake:
        yield fake


@pytest.fixture
def client(fake: FakeOrchard) -> Iterator[Orchard]:
    with fake.client() as client:
        yield client
