"""orchard.testing's public names are a contract, like the SDK's."""

from __future__ import annotations

import subprocess
import sys

import orchard.testing

EXPECTED = {
    "AsyncFakeTransport", "DEFAULT_API_KEY", "EXECUTOR_ADDRESS", "ExecCall", "FakeImage",
    "FakeOrchard", "FakeTemplate", "FakeTransport", "GATEWAY_ADDRESS", "SandboxRecord",
    "ScriptedResult",
}  # fmt: skip


def test_exported_names_are_pinned() -> None:
    assert set(orchard.testing.__all__) == EXPECTED
    for name in EXPECTED:
        assert getattr(orchard.testing, name) is not None


def test_importing_the_fake_loads_no_service() -> None:
    """What the SDK imports and nothing more: no service, no server-side dependency."""
    code = (
        "import sys, orchard.testing; "
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in "
        "('structlog', 'uvloop', 'kubernetes', 'openai', 'numpy', 'aiohttp', 'opentelemetry') "
        "or m.split('.')[:2] in (['orchard', s] for s in "
        "('executor', 'scheduler', 'gateway', 'rewards', 'cli'))); print(bad)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_every_rpc_of_the_served_protos_is_implemented() -> None:
    """A new RPC in protos/ must get a fake too (the generated registration would fail)."""
    from orchard._proto.orchard.v1 import executor_pb2, pools_pb2, sandbox_pb2
    from orchard.testing import _control, _executor

    servicers = {
        "SandboxService": _control.FakeSandboxService,
        "PoolService": _control.FakePoolService,
        "ExecutorService": _executor.FakeExecutorService,
    }
    for module in (sandbox_pb2, pools_pb2, executor_pb2):
        for name, service in module.DESCRIPTOR.services_by_name.items():
            missing = [m for m in service.methods_by_name if not hasattr(servicers[name], m)]
            assert missing == [], f"{name}: no fake for {missing}"
