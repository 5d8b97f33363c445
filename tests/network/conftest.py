"""The fake internet (``testnet.fake_internet``), one per test module that asks for it.

Its addresses (203.0.113.0/24 on a host veth) are fixed, so two of them on one host
collide: every file with a test that uses it must be in the ``fake-internet`` group of
tests/phases.py, which one worker of ``make test``'s parallel phase runs file after file
(checked here at collection).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests import phases

from .testnet import FakeInternet, fake_internet


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    users = {
        phases.file_of(item.nodeid)
        for item in items
        if "internet" in getattr(item, "fixturenames", ())
    }
    unlisted = sorted(path for path in users if phases.unit_of(path) != "group:fake-internet")
    if unlisted:
        raise pytest.UsageError(
            f"{', '.join(unlisted)} use the fake internet: add them to the fake-internet "
            "group in tests/phases.py (GROUPS), or two of them run at once under make test"
        )


@pytest.fixture(scope="module")
def internet() -> Iterator[FakeInternet]:
    with fake_internet() as net:
        yield net
