"""The fake internet (``testnet.fake_internet``), one per test module that asks for it.

While one exists, the host routes 203.0.113.0/24 into it (a host veth with fixed
addresses): two of them collide, and on machines whose package registries are in that
range (pypi.org, registry.npmjs.org and deb.debian.org were 203.0.113.80 here) every
download on the host fails while it is up. So every test of a file that uses it runs in
``make test``'s serial phase, alone (marked ``serial`` here; tests/phases.py).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from .testnet import FakeInternet, fake_internet


@pytest.hookimpl(tryfirst=True)  # before the phase selection (tests/phases.py) reads it
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    users = {item.path for item in items if "internet" in getattr(item, "fixturenames", ())}
    for item in items:
        if item.path in users:
            item.add_marker(pytest.mark.serial)


@pytest.fixture(scope="module")
def internet() -> Iterator[FakeInternet]:
    with fake_internet() as net:
        yield net
