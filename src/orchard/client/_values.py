"""Parsing the friendly argument forms of ``Sandbox.create`` (pure functions).

- ``cpu``: cores as a number (``0.5``, ``2``) or a string (``"0.5"``, ``"500m"``).
- ``memory``: bytes as an int, or a string with a binary (``"512Mi"``, ``"1Gi"``)
  or decimal (``"500M"``, ``"1G"``) suffix.
- ``ttl``: seconds (number) or a ``datetime.timedelta``.
- ``network``: ``"none"`` (default), ``"internet"``, or ``"allowlist"``.
- ``tools``: ``True`` (the harness CLIs, layer ``"harnesses"`` at ``/opt/orchard/tools``),
  ``False``/``None`` (none), or a list of tools layer names.
"""

from __future__ import annotations

import datetime as dt
import math
import re
from collections.abc import Sequence

from orchard._proto.orchard.v1 import common_pb2

from ._errors import InvalidRequestError
from ._network import NetworkPolicy, network_proto

_UNITS = {
    "": 1, "k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12,
    "ki": 1 << 10, "mi": 1 << 20, "gi": 1 << 30, "ti": 1 << 40,
}  # fmt: skip
_MEMORY_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]i?)?b?\s*$", re.IGNORECASE)

Cpu = float | int | str
Memory = int | str
Ttl = float | int | dt.timedelta
Tools = bool | Sequence[str]

DEFAULT_TOOL_LAYERS = ("harnesses",)
"""What ``tools=True`` mounts: the agent harness CLIs and their Node.js (docs/tools-layer.md)."""


def cpu_millis(cpu: Cpu | None) -> int:
    """Millicores for ``cpu`` given in cores (0 for None: the server's default)."""
    if cpu is None:
        return 0
    if isinstance(cpu, str):
        text = cpu.strip()
        try:
            cores = int(text[:-1]) / 1000 if text.endswith("m") else float(text)
        except ValueError:
            raise InvalidRequestError(
                f"cpu: {cpu!r} is not a number of cores (e.g. 0.5, 2 or '500m')"
            ) from None
    elif isinstance(cpu, bool):
        raise InvalidRequestError("cpu: expected a number of cores, got a bool")
    else:
        cores = float(cpu)
    if not math.isfinite(cores) or cores <= 0:
        raise InvalidRequestError(f"cpu: must be a positive number of cores (got {cpu!r})")
    return max(1, round(cores * 1000))


def memory_bytes(memory: Memory | None) -> int:
    """Bytes for ``memory`` (0 for None: the server's default)."""
    if memory is None:
        return 0
    if isinstance(memory, bool):
        raise InvalidRequestError("memory: expected bytes or a string like '512Mi', got a bool")
    if isinstance(memory, int):
        if memory <= 0:
            raise InvalidRequestError(f"memory: must be positive (got {memory})")
        return memory
    match = _MEMORY_RE.match(memory)
    if not match:
        raise InvalidRequestError(
            f"memory: {memory!r} is not a size (e.g. 536870912, '512Mi', '1Gi')"
        )
    number, unit = match.groups()
    value = int(float(number) * _UNITS[(unit or "").lower()])
    if value <= 0:
        raise InvalidRequestError(f"memory: must be positive (got {memory!r})")
    return value


def ttl_seconds(ttl: Ttl | None) -> int:
    if ttl is None:
        return 0
    seconds = ttl.total_seconds() if isinstance(ttl, dt.timedelta) else float(ttl)
    if not math.isfinite(seconds) or seconds <= 0:
        raise InvalidRequestError(f"ttl: must be a positive number of seconds (got {ttl!r})")
    return max(1, math.ceil(seconds))


def tool_layers(tools: Tools | None) -> list[str]:
    if tools is None or tools is False:
        return []
    if tools is True:
        return list(DEFAULT_TOOL_LAYERS)
    if isinstance(tools, str) or not all(isinstance(name, str) for name in tools):
        raise InvalidRequestError(
            f"tools: True, False or a list of tools layer names (got {tools!r})"
        )
    return list(tools)


def network_policy(network: str | NetworkPolicy | None) -> common_pb2.NetworkPolicy:
    return network_proto(network)
