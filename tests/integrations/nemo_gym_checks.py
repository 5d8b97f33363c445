"""The Orchard provider through NeMo Gym's own sandbox API, against a real stack.

Run by ``test_nemo_gym.py`` with pytest in ``.venv-nemo-gym`` (``make nemo-gym-venv``;
see ``side_venv.py``). Everything goes through ``nemo_gym.sandbox``: the provider is
found by name in NeMo Gym's registry (our entry point), and ``AsyncSandbox`` calls it
as NeMo Gym's resources servers do (``start(spec)``, ``exec``, ``upload``/``download``,
``status``, ``endpoint``, ``stop``).
"""

from __future__ import annotations

import asyncio
import time
import urllib.request
from collections.abc import Awaitable, Callable
from dataclasses import replace
from pathlib import Path

import pytest
from nemo_gym.sandbox import AsyncSandbox
from nemo_gym.sandbox.providers import (
    SandboxCreateError,
    SandboxSpec,
    SandboxStatus,
    get_provider_class,
    list_providers,
)

import orchard
from orchard.integrations.nemo_gym import OrchardProvider, register
from tests.integrations.sandbox_waits import gone

SPEC = SandboxSpec(
    image="debian:bookworm",
    workdir="/srv/app",
    env={"GREETING": "hi"},
    files={"/srv/app/seed.txt": "seeded"},
    resources={"cpu": 1, "memory_mib": 512},
    metadata={"suite": "nemo-gym"},
    ports=(8000,),
)


def _run(check: Callable[[AsyncSandbox], Awaitable[None]], spec: SandboxSpec = SPEC) -> None:
    async def scenario() -> None:
        async with AsyncSandbox({"orchard": {}}, spec) as sb:  # exit stops it
            await sb.start()
            await check(sb)
        assert await sb.status() == SandboxStatus.STOPPED

    asyncio.run(scenario())


def test_the_registry_finds_the_provider_by_name_and_register_adds_it() -> None:
    assert "orchard" in list_providers()
    assert get_provider_class("orchard") is OrchardProvider  # from our entry point
    register()
    assert get_provider_class("orchard") is OrchardProvider  # register_provider's table
    with pytest.raises(ValueError, match="already registered"):
        register()
    register(override=True)


def test_exec_with_cwd_env_timeout_and_user() -> None:
    async def check(sb: AsyncSandbox) -> None:
        assert await sb.status() == SandboxStatus.RUNNING
        r = await sb.exec('pwd; cat seed.txt; echo " $GREETING $X"; exit 3', env={"X": "y"})
        assert (r.stdout, r.return_code, r.error_type) == ("/srv/app\nseeded hi y\n", 3, None)
        assert (await sb.exec("pwd", cwd="/tmp")).stdout == "/tmp\n"
        assert (await sb.exec("id -un", user="nobody")).stdout == "nobody\n"
        assert (await sb.exec("id -u", user=65534)).stdout == "65534\n"
        assert (await sb.exec("id -u", user="root")).stdout == "0\n"
        started = time.monotonic()
        r = await sb.exec("echo before; sleep 30", timeout_s=1)
        assert (r.return_code, r.error_type, r.stdout) == (125, "timeout", "before\n")
        assert "timed out after 1s" in (r.stderr or "")
        assert time.monotonic() - started < 20
        assert (await sb.exec("kill -9 $$")).return_code == 137

    _run(check)


def test_upload_and_download(tmp_path: Path) -> None:
    (tmp_path / "in.bin").write_bytes(bytes(range(256)) * 2048)

    async def check(sb: AsyncSandbox) -> None:
        await sb.upload(tmp_path / "in.bin", "/srv/data/deep/in.bin")
        assert (await sb.exec("wc -c < /srv/data/deep/in.bin")).stdout == "524288\n"
        await sb.download("/srv/data/deep/in.bin", tmp_path / "out" / "back.bin")
        assert (tmp_path / "out" / "back.bin").read_bytes() == (tmp_path / "in.bin").read_bytes()
        with pytest.raises(FileNotFoundError, match="/srv/missing"):
            await sb.download("/srv/missing", tmp_path / "missing.bin")
        assert not (tmp_path / "missing.bin").exists()
        with pytest.raises(FileNotFoundError):
            await sb.upload(tmp_path / "nothing-here", "/srv/x")

    _run(check)


def test_endpoint_reaches_an_http_server_in_the_sandbox() -> None:
    async def check(sb: AsyncSandbox) -> None:
        await sb.exec("echo served > index.html")
        await sb.exec(
            "setsid python3 -m http.server 8000 --bind 127.0.0.1 >/dev/null 2>&1 </dev/null &"
        )
        endpoint = await sb.endpoint(8000)
        assert endpoint.endpoint.startswith("http://127.0.0.1:")
        assert await sb.endpoint(8000) == endpoint  # one forward per port, reused

        def get() -> bytes:
            deadline = time.monotonic() + 20
            while True:
                try:
                    with urllib.request.urlopen(f"{endpoint.endpoint}/index.html", timeout=5) as r:
                        return bytes(r.read())
                except OSError:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.2)

        assert await asyncio.to_thread(get) == b"served\n"
        with pytest.raises(ValueError, match="not declared"):
            await sb.endpoint(9000)  # NeMo Gym's own check: only declared ports

    _run(check)


def test_infrastructure_failures_read_as_sandbox_errors() -> None:
    async def check(sb: AsyncSandbox) -> None:
        # the sandbox disappears under the rollout (deleted elsewhere, TTL, node lost):
        # found by the label the spec's metadata became
        async with orchard.AsyncOrchard() as other:
            [info] = await other.sandboxes.list(labels={"suite": "nemo-gym-infra"})
            await other.sandboxes.delete(info.id)
            await gone(other, info.id)
        r = await sb.exec("true")
        assert (r.return_code, r.error_type) == (125, "sandbox")
        assert await sb.status() == SandboxStatus.STOPPED

    _run(check, replace(SPEC, metadata={"suite": "nemo-gym-infra"}))


def test_what_cannot_be_honoured_is_refused_before_creating() -> None:
    async def start(spec: SandboxSpec, config: dict[str, object] | None = None) -> None:
        async with AsyncSandbox({"orchard": config or {}}, spec) as sb:
            await sb.start()

    for spec, message in [
        (SandboxSpec(image="debian:bookworm", entrypoint=["sleep", "9"]), "no entrypoint"),
        (SandboxSpec(image="debian:bookworm", resources={"disk_gib": 5}), "disk size"),
        (SandboxSpec(image="debian:bookworm", resources={"gpu": 1}), "no GPUs"),
        (SandboxSpec(image="debian:bookworm", provider_options={"zone": "a"}), "zone"),
    ]:
        with pytest.raises(ValueError, match=message):
            asyncio.run(start(spec))
    with pytest.raises(SandboxCreateError, match="image"):
        asyncio.run(start(SandboxSpec(image="no-such-image:1")))
    with pytest.raises(SandboxCreateError, match="could not create"):
        asyncio.run(start(SandboxSpec(image="debian:bookworm"), {"endpoint": "127.0.0.1:1"}))
