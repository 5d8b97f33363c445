"""The fake internet (``testnet.fake_internet``), one per test module that asks for it.

Its addresses (203.0.113.0/24 on a host veth) are fixed, so two of them on one host
collide: every file with a test that uses it is in the ``fake-internet`` xdist group,
which one worker of ``make test``'s parallel phase runs in a row (tests/phases.py). The
whole file, so its other module fixtures (a stack) still start once.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from .testnet import FakeInternet, fake_internet

FAKE_INTERNET_GROUP = pytest.mark.xdist_group("fake-internet")


@pytest.hookimpl(tryfirst=True)  # before xdist names the group in the test ids
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    files = {item.path for item in items if "internet" in getattr(item, "fixturenames", ())}
    for item in items:
        if item.path in files:
            item.add_marker(FAKE_INTERNET_GROUP)


@pytest.fixture(scope="module")
def internet() -> Iterator[FakeInternet]:
    with fake_internet() as net:
        yield net
