"""Suite-wide policy.

Tests that need root, runc or the default image skip themselves with a reason
when run by hand on a machine without them. Under ``make test`` (which installs
all of that first) ORCHARD_TEST_STRICT=1 turns every such skip into a failure:
a green run must mean the containers really ran. A skip whose reason starts
with "optional:" (e.g. a real Kubernetes cluster) stays a skip.

``make test`` runs the suite in two phases (``tests/phases.py``, docs/testing.md):
``ORCHARD_TEST_PHASE`` picks one, and the parallel phase's files go to pytest-xdist's
workers whole (one module's stack is started once).
"""

from __future__ import annotations

import os
from collections.abc import Generator

import pytest

from tests import phases

STRICT = os.environ.get("ORCHARD_TEST_STRICT") == "1"


def pytest_configure(config: pytest.Config) -> None:
    phases.register(config)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, None]:
    outcome = yield
    report: pytest.TestReport = outcome.get_result()
    if not STRICT or not report.skipped or hasattr(report, "wasxfail"):
        return
    reason = (
        str(report.longrepr[-1]) if isinstance(report.longrepr, tuple) else str(report.longrepr)
    )
    if reason.startswith("Skipped: optional:") or reason.startswith("optional:"):
        return
    report.outcome = "failed"
    report.longrepr = (
        f"skipped under ORCHARD_TEST_STRICT=1 (make test installs everything): {reason}"
    )
