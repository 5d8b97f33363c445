"""The Harbor backend's contract, run with Harbor's real package against a real stack.

Harbor needs Python >= 3.12, the suite's venv is 3.11: ``test_harbor.py`` runs this file
with pytest in ``.venv-harbor`` (``make harbor-venv``) and ORCHARD_ENDPOINT /
ORCHARD_API_KEY pointing at its stack. The file name does not start with ``test_`` so
the 3.11 suite never collects it (it imports Harbor).

Each check drives ``OrchardEnvironment`` the way Harbor's trial runner does
(``harbor.trial.trial``): construct with the task's environment config, ``start``,
``exec`` / uploads / downloads, ``stop(delete=True)``.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from harbor.environments.base import HealthcheckError, SandboxBuildFailedError
from harbor.models.task.config import EnvironmentConfig, NetworkMode, NetworkPolicy
from harbor.models.trial.paths import TrialPaths

import orchard
from orchard.integrations.harbor import OrchardEnvironment
from tests.integrations.sandbox_waits import gone

Check = Callable[[OrchardEnvironment], Awaitable[None]]


def _env(tmp_path: Path, dockerfile: str | None = None, **kwargs: Any) -> OrchardEnvironment:
    environment_dir = tmp_path / "environment"
    environment_dir.mkdir(parents=True, exist_ok=True)
    if dockerfile is not None:
        (environment_dir / "Dockerfile").write_text(dockerfile)
    config = kwargs.pop("config", None) or EnvironmentConfig(
        network_mode=NetworkMode.NO_NETWORK, cpus=1, memory_mb=512
    )
    trial_paths = TrialPaths(tmp_path / "trial")
    trial_paths.mkdir()
    return OrchardEnvironment(
        environment_dir=environment_dir,
        environment_name="check",
        session_id="check__env",
        trial_paths=trial_paths,
        task_env_config=config,
        network_policy=NetworkPolicy(network_mode=config.network_mode),
        **kwargs,
    )


def _run(env: OrchardEnvironment, check: Check) -> None:
    async def scenario() -> None:
        await env.start(force_build=False)
        try:
            await check(env)
        finally:
            await env.stop(delete=True)

    asyncio.run(scenario())


DOCKERFILE = "FROM debian:bookworm\nWORKDIR /app\nENV GREETING=hello\nUSER nobody\n"


def test_exec_honours_dockerfile_workdir_env_user_and_per_call_values(tmp_path: Path) -> None:
    async def check(env: OrchardEnvironment) -> None:
        r = await env.exec(
            'pwd; echo "$GREETING $EXTRA"; id -un; echo err >&2; exit 3', env={"EXTRA": "x"}
        )
        assert (r.return_code, r.stdout, r.stderr) == (3, "/app\nhello x\nnobody\n", "err\n")
        r = await env.exec("pwd; id -un", cwd="/tmp", user="root")
        assert r.stdout == "/tmp\nroot\n"
        # Harbor's default_user (set by the trial for the agent) wins over the image's USER
        with env.with_default_user(0):
            assert (await env.exec("id -u")).stdout == "0\n"
        # a signal death reads as the shell's 128 + signal, like Docker's backend
        assert (await env.exec("kill -9 $$")).return_code == 137

    _run(_env(tmp_path, DOCKERFILE), check)


def test_a_command_past_its_timeout_raises_timeout_error(tmp_path: Path) -> None:
    async def check(env: OrchardEnvironment) -> None:
        started = time.monotonic()
        with pytest.raises(TimeoutError, match="timed out after 1 seconds"):
            await env.exec("sleep 30", timeout_sec=1)
        assert time.monotonic() - started < 20
        assert (await env.exec("echo alive")).stdout == "alive\n"

    _run(_env(tmp_path, DOCKERFILE), check)


def test_files_and_directories_both_ways_and_missing_paths(tmp_path: Path) -> None:
    (tmp_path / "up" / "sub").mkdir(parents=True)
    (tmp_path / "up" / "a.txt").write_text("A")
    (tmp_path / "up" / "sub" / "b.bin").write_bytes(os.urandom(300_000))
    (tmp_path / "one.txt").write_text("one")

    async def check(env: OrchardEnvironment) -> None:
        await env.upload_file(tmp_path / "one.txt", "/data/one.txt")
        await env.upload_dir(tmp_path / "up", "/data/tree")
        assert await env.is_file("/data/one.txt") and await env.is_dir("/data/tree/sub")
        await env.download_file("/data/one.txt", tmp_path / "back" / "one.txt")
        assert (tmp_path / "back" / "one.txt").read_text() == "one"
        await env.download_dir("/data/tree", tmp_path / "tree")
        assert (tmp_path / "tree" / "a.txt").read_text() == "A"
        assert (tmp_path / "tree" / "sub" / "b.bin").read_bytes() == (
            tmp_path / "up" / "sub" / "b.bin"
        ).read_bytes()
        with pytest.raises(FileNotFoundError, match="/data/missing"):
            await env.download_file("/data/missing", tmp_path / "missing")
        assert not (tmp_path / "missing").exists()
        with pytest.raises(FileNotFoundError):
            await env.download_dir("/nowhere", tmp_path / "nowhere")

    _run(_env(tmp_path, DOCKERFILE), check)


def test_a_dockerfile_that_needs_a_build_is_refused_by_name(tmp_path: Path) -> None:
    with pytest.raises(SandboxBuildFailedError, match=r"Dockerfile:3: RUN changes the image"):
        _env(tmp_path, "FROM debian:bookworm\nWORKDIR /app\nRUN apt-get install -y curl\n")
    (tmp_path / "environment" / "Dockerfile").unlink()
    (tmp_path / "environment" / "docker-compose.yaml").write_text("services: {}\n")
    with pytest.raises(SandboxBuildFailedError, match="Docker Compose"):
        _env(tmp_path)


def test_force_build_is_refused(tmp_path: Path) -> None:
    env = _env(tmp_path, DOCKERFILE)
    with pytest.raises(SandboxBuildFailedError, match="does not build images"):
        asyncio.run(env.start(force_build=True))


def test_an_unknown_image_is_refused_and_the_mapping_chooses_one(tmp_path: Path) -> None:
    config = EnvironmentConfig(docker_image="ubuntu:24.04", network_mode=NetworkMode.NO_NETWORK)
    env = _env(tmp_path, config=config)
    with pytest.raises(SandboxBuildFailedError, match=r"ubuntu:24.04.*images="):
        asyncio.run(env.start(force_build=False))

    async def check(env: OrchardEnvironment) -> None:
        r = await env.exec(". /etc/os-release; echo $VERSION_CODENAME")
        assert r.stdout == "bookworm\n"

    config = EnvironmentConfig(docker_image="ubuntu:24.04", network_mode=NetworkMode.NO_NETWORK)
    _run(_env(tmp_path, config=config, images={"*": "debian:bookworm"}), check)


def test_network_policy_at_start_and_switched_later(tmp_path: Path) -> None:
    async def check(env: OrchardEnvironment) -> None:
        assert (await env.sandbox.info()).network.mode == "none"
        allow = NetworkPolicy(
            network_mode=NetworkMode.ALLOWLIST, allowed_hosts=["pypi.org", "10.9.8.7"]
        )
        await env.set_network_policy(allow)
        network = (await env.sandbox.info()).network
        assert (network.mode, network.domains, network.cidrs) == (
            "allowlist",
            ("pypi.org",),
            ("10.9.8.7/32",),
        )

    _run(_env(tmp_path, DOCKERFILE), check)


def test_infrastructure_failures_are_harbors_sandbox_failures(tmp_path: Path) -> None:
    async def check(env: OrchardEnvironment) -> None:
        # the sandbox disappears under the trial (deleted elsewhere, TTL, node lost)
        async with orchard.AsyncOrchard() as other:
            await other.sandboxes.delete(env.sandbox.id)
            await gone(other, env.sandbox.id)
        with pytest.raises(HealthcheckError, match="unavailable during exec"):
            await env.exec("true")

    _run(_env(tmp_path, DOCKERFILE), check)
    # nothing listens on port 1: Orchard's ServiceUnavailableError must not reach Harbor
    # (Harbor would read that class name as a model provider's failure)
    down = _env(tmp_path / "down", DOCKERFILE, endpoint="127.0.0.1:1")
    with pytest.raises(HealthcheckError, match="unavailable during create"):
        asyncio.run(down.start(force_build=False))
