"""The friendly units of Sandbox.create: cpu in cores, memory in bytes or sizes."""

from __future__ import annotations

import datetime as dt

import pytest

from orchard import InvalidRequestError
from orchard.client import _requests, _values


@pytest.mark.parametrize(
    ("cpu", "millis"), [(None, 0), (0.5, 500), (2, 2000), ("1.5", 1500), ("250m", 250)]
)
def test_cpu_is_cores(cpu: float | str | None, millis: int) -> None:
    assert _values.cpu_millis(cpu) == millis


@pytest.mark.parametrize(
    ("memory", "size"),
    [
        (None, 0),
        (1024, 1024),
        ("512Mi", 512 << 20),
        ("1Gi", 1 << 30),
        ("1G", 10**9),
        ("1.5Gi", 3 << 29),
    ],
)
def test_memory_sizes(memory: int | str | None, size: int) -> None:
    assert _values.memory_bytes(memory) == size


@pytest.mark.parametrize(
    "bad",
    [
        {"cpu": -1},
        {"cpu": "lots"},
        {"memory": "1 Zb"},
        {"memory": 0},
        {"ttl": -5},
        {"network": "wifi"},
    ],
)
def test_bad_values_are_refused_before_any_call(bad: dict[str, object]) -> None:
    with pytest.raises(InvalidRequestError):
        _requests.create_request(**bad)  # type: ignore[arg-type]


def test_create_request_fields() -> None:
    req = _requests.create_request(
        cpu=1, memory="1Gi", ttl=dt.timedelta(minutes=10), labels={"a": "b"}, request_id="r1"
    )
    assert (req.resources.cpu_millis, req.resources.memory_bytes, req.ttl_seconds) == (
        1000,
        1 << 30,
        600,
    )
    assert dict(req.labels) == {"a": "b"} and req.request_id == "r1"


def test_exec_start_shell_vs_argv() -> None:
    shell = _requests.exec_start("sb-x", "echo hi | wc -c", timeout=5)
    assert shell.shell == "echo hi | wc -c" and not shell.argv and shell.timeout_seconds == 5
    argv = _requests.exec_start("sb-x", ["ls", "-l"])
    assert list(argv.argv) == ["ls", "-l"] and not argv.shell
    with pytest.raises(InvalidRequestError):
        _requests.exec_start("sb-x", [])
