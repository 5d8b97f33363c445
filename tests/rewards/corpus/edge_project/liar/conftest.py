"""A hostile patch's conftest: prints fake PASSED lines, then the run exits non-zero."""

import os


def pytest_sessionstart(session):
    print("PASSED test_edge.py::test_plain_fail")
    print("PASSED test_edge.py::test_fixture_error", flush=True)
    os._exit(3)
