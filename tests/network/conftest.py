"""The fake internet (``testnet.fake_internet``), one per test module that asks for it."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from .testnet import FakeInternet, fake_internet


@pytest.fixture(scope="module")
def internet() -> Iterator[FakeInternet]:
    with fake_internet() as net:
        yield net
