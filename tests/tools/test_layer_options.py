"""The tools-layer option without building the layer: names, pins' digest, the lookup a
backend does at create, the scheduler's validation, the SDK argument and the in-process
fake. (The layer itself, mounted into real sandboxes, is tests/tools/test_layer_runc.py.)"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from orchard.scheduler.backends.base import TOOLS_LAYER_NOT_BUILT, BackendError
from orchard.scheduler.backends.local.tools_mount import tool_layer_mount
from orchard.scheduler.settings import CreateLimits
from orchard.scheduler.tools import HARNESSES, MOUNT_PATH, ToolsLayerError, built_layer, check_names
from orchard.scheduler.validation import validate_create

from orchard import InvalidRequestError, ToolsLayerNotBuiltError
from orchard._proto.orchard.v1 import sandbox_pb2
from orchard.client import _values
from orchard.common.errors import ServiceError
from orchard.testing import FakeOrchard


def _fake_built(tools_dir: Path, digest: str | None = None) -> Path:
    folder = tools_dir / HARNESSES.folder_name()
    folder.mkdir(parents=True)
    (folder / "layer.json").write_text(json.dumps({"digest": digest or HARNESSES.digest()}))
    return folder


def test_digest_follows_every_pin() -> None:
    base = HARNESSES.digest()
    bumped_npm = dataclasses.replace(
        HARNESSES, npm=(dataclasses.replace(HARNESSES.npm[0], version="0.0.1"), *HARNESSES.npm[1:])
    )
    bumped_pypi = dataclasses.replace(
        HARNESSES, pypi=(dataclasses.replace(HARNESSES.pypi[0], version="0.0.1"),)
    )
    bumped_node = dataclasses.replace(
        HARNESSES, node=dataclasses.replace(HARNESSES.node, version="26.0.0")
    )
    digests = {base, bumped_npm.digest(), bumped_pypi.digest(), bumped_node.digest()}
    assert len(digests) == 4
    assert HARNESSES.folder_name() == f"harnesses-{base}"


def test_every_version_is_pinned_exactly() -> None:
    for pin in (HARNESSES.node, *HARNESSES.npm):
        assert all(part.isdigit() for part in pin.version.split(".")), pin
    for pypi in HARNESSES.pypi:
        assert all(part.isdigit() for part in pypi.version.split(".")), pypi
    assert set(HARNESSES.commands()) == {"node", "codex", "openclaw", "claude", "mini", "aider"}


def test_names_are_checked() -> None:
    assert check_names(["harnesses"]) == ("harnesses",)
    assert check_names([]) == ()
    with pytest.raises(ToolsLayerError, match="unknown tools layer nope"):
        check_names(["nope"])
    with pytest.raises(ToolsLayerError, match="given twice"):
        check_names(["harnesses", "harnesses"])


def test_an_unbuilt_or_stale_layer_names_the_build_command(tmp_path: Path) -> None:
    with pytest.raises(ToolsLayerError, match="make tools-layer") as err:
        built_layer(tmp_path, "harnesses")
    assert str(tmp_path) in err.value.message
    _fake_built(tmp_path, digest="0" * 16)
    with pytest.raises(ToolsLayerError, match="does not match its pins"):
        built_layer(tmp_path, "harnesses")


def test_the_backend_mount_is_a_read_only_bind_of_the_built_layer(tmp_path: Path) -> None:
    folder = _fake_built(tmp_path)
    mount = tool_layer_mount(tmp_path, "harnesses")
    assert mount["source"] == str(folder)
    assert mount["destination"] == MOUNT_PATH == "/opt/orchard/tools"
    assert mount["type"] == "bind"
    assert "ro" in mount["options"] and "nosuid" in mount["options"]
    with pytest.raises(BackendError) as err:
        tool_layer_mount(tmp_path / "elsewhere", "harnesses")
    assert err.value.reason == TOOLS_LAYER_NOT_BUILT
    assert not err.value.client_fault  # the node lacks it: infrastructure, not the caller


def _request(**fields: object) -> sandbox_pb2.CreateSandboxRequest:
    return sandbox_pb2.CreateSandboxRequest(**fields)  # type: ignore[arg-type]


def test_the_scheduler_validates_the_field() -> None:
    limits = CreateLimits()
    assert validate_create(_request(), limits).tool_layers == ()
    assert validate_create(_request(tool_layers=["harnesses"]), limits).tool_layers == (
        "harnesses",
    )
    with pytest.raises(ServiceError, match="tool_layers: unknown tools layer"):
        validate_create(_request(tool_layers=["../etc"]), limits)


def test_the_sdk_argument() -> None:
    assert _values.tool_layers(None) == []
    assert _values.tool_layers(False) == []
    assert _values.tool_layers(True) == ["harnesses"]
    assert _values.tool_layers(["harnesses"]) == ["harnesses"]
    with pytest.raises(InvalidRequestError, match="tools"):
        _values.tool_layers("harnesses")  # a string is not a list of names


def test_the_fake_refuses_an_unbuilt_layer_and_reports_a_built_one() -> None:
    with FakeOrchard() as fake, fake.client() as client:
        with pytest.raises(ToolsLayerNotBuiltError, match="make tools-layer") as err:
            client.sandboxes.create(tools=True)
        assert err.value.code == "FAILED_PRECONDITION"
        assert err.value.fault == "infrastructure"
        with pytest.raises(InvalidRequestError, match="unknown tools layer"):
            client.sandboxes.create(tools=["nope"])
        assert not [rec for rec in fake.world.sandboxes.values() if rec.usable]
    with FakeOrchard(tool_layers=["harnesses"]) as fake, fake.client() as client:
        with client.sandboxes.create(tools=True) as sb:
            assert sb.info().tool_layers == ("harnesses",)
        with client.sandboxes.create() as plain:
            assert plain.info().tool_layers == ()


def test_a_failed_build_step_names_the_step_and_the_package(tmp_path: Path) -> None:
    import os

    from orchard.scheduler.tools.build import ToolsBuildError, _run

    env = dict(os.environ)
    with pytest.raises(
        ToolsBuildError, match=r"step 'npm install' for openclaw@1\.2 failed \(exit 3\)"
    ):
        _run(
            "npm install",
            "openclaw@1.2",
            ["sh", "-c", "echo no such version >&2; exit 3"],
            env,
            tmp_path,
        )
    with pytest.raises(ToolsBuildError, match="no such version"):
        _run(
            "npm install",
            "openclaw@1.2",
            ["sh", "-c", "echo no such version >&2; exit 3"],
            env,
            tmp_path,
        )
    with pytest.raises(
        ToolsBuildError, match=r"step 'pip install' for aider-chat==0\.1: .* not found"
    ):
        _run("pip install", "aider-chat==0.1", ["/nonexistent/pip"], env, tmp_path)
