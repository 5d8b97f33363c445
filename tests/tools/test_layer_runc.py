"""The tools layer mounted into real runc sandboxes through a real ``orchard up``.

Needs the layer built (``make tools-layer``, which ``make test`` runs first) under
ORCHARD_TOOLS_DIR (default /var/lib/orchard/tools). Checks: every CLI starts in the
sandbox image (its own /usr/bin/python3 for the PyPI ones, the layer's Node.js for the
npm ones) at the pinned version; the sandbox cannot write, delete or remount the layer;
a sandbox created without the option has no trace of it; a node without the layer
refuses the create with FAILED_PRECONDITION naming the build command; the harness's
Python packages do not leak into the agent's own ``python3``.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from orchard.scheduler.tools import HARNESSES, MOUNT_PATH

from orchard import Orchard, ToolsLayerNotBuiltError
from tests.stack import REQUIRES_STACK, TOOLS_DIR, Stack, running_stack

LAYER = TOOLS_DIR / HARNESSES.folder_name()

pytestmark = [
    *REQUIRES_STACK,
    pytest.mark.timeout(600),
    pytest.mark.skipif(
        not (LAYER / "layer.json").is_file(), reason=f"no tools layer at {LAYER} (make tools-layer)"
    ),
]

# What each wrapper prints for its version probe, from the pins (mini has only --help).
EXPECTED = {
    "node": ("--version", f"v{HARNESSES.node.version}"),
    "codex": ("--version", f"codex-cli {HARNESSES.npm[0].version}"),
    "openclaw": ("--version", f"OpenClaw {HARNESSES.npm[1].version}"),
    "claude": ("--version", f"{HARNESSES.npm[2].version} (Claude Code)"),
    "mini": ("--help", "Run mini-SWE-agent in your local environment"),
    "aider": ("--version", f"aider {HARNESSES.pypi[1].version}"),
}


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    with running_stack(tmp_path_factory.mktemp("tools") / "home") as running:
        yield running


@pytest.fixture(scope="module")
def client(stack: Stack) -> Iterator[Orchard]:
    key = (stack.home / "dev-api-key").read_text().strip()
    with Orchard(stack.endpoint, key) as client:
        yield client


def test_every_cli_starts_in_the_sandbox_at_its_pinned_version(client: Orchard) -> None:
    assert set(EXPECTED) == set(HARNESSES.commands())
    with client.sandboxes.create(tools=True, memory="2Gi", ttl=600) as sb:
        assert sb.info().tool_layers == ("harnesses",)
        listing = sb.exec(["ls", f"{MOUNT_PATH}/bin"])
        assert sorted(listing.stdout_text.split()) == sorted(EXPECTED)
        # exec, not read_file: the file API reads the sandbox's root file system from the
        # node, where the layer's bind mount (made inside the sandbox) is not seen.
        meta = json.loads(sb.exec(["cat", f"{MOUNT_PATH}/layer.json"]).stdout)
        assert meta["digest"] == HARNESSES.digest()
        for command, (flag, wanted) in EXPECTED.items():
            result = sb.exec(
                [f"{MOUNT_PATH}/bin/{command}", flag],
                timeout=120,
                env={"HOME": "/var/tmp/probe-home", "NO_COLOR": "1", "TERM": "dumb"},
            )
            assert result.exit_code == 0, (command, result.stdout_text, result.stderr_text)
            assert wanted in result.stdout_text + result.stderr_text, (command, result)


def test_the_sandbox_cannot_change_the_layer(client: Orchard) -> None:
    with client.sandboxes.create(tools=True, ttl=600) as sb:
        for cmd in (
            f"touch {MOUNT_PATH}/bin/new",
            f"rm -f {MOUNT_PATH}/bin/codex",
            f"echo x >> {MOUNT_PATH}/layer.json",
            f"chmod 777 {MOUNT_PATH}/bin/node",
        ):
            result = sb.exec(["sh", "-c", cmd])
            assert result.exit_code != 0, cmd
            # In a user namespace (the default) the host-owned files refuse the sandbox's
            # root first ("Permission denied"); without one the mount does ("Read-only").
            refused = ("Read-only file system", "Permission denied", "Operation not permitted")
            assert any(r in result.stderr_text for r in refused), (cmd, result.stderr_text)
        # Whatever refused first, the layer is a read-only mount either way.
        mounts = sb.exec(["cat", "/proc/self/mounts"]).stdout_text.splitlines()
        layer = [m.split() for m in mounts if m.split()[1:2] == [MOUNT_PATH]]
        assert layer and "ro" in layer[0][3].split(","), layer
        remount = sb.exec(
            ["sh", "-c", f"mount -o remount,rw {MOUNT_PATH} 2>&1 || umount {MOUNT_PATH}"]
        )
        assert remount.exit_code != 0
        assert sb.exec(["test", "-x", f"{MOUNT_PATH}/bin/codex"]).exit_code == 0
        # The harness's Python packages reach only the harness (python3 -I in its wrapper).
        leak = sb.exec(["python3", "-c", "import litellm"])
        assert leak.exit_code != 0 and "No module named 'litellm'" in leak.stderr_text


def test_a_sandbox_without_the_option_has_no_layer(client: Orchard) -> None:
    with client.sandboxes.create(ttl=600) as sb:
        assert sb.info().tool_layers == ()
        assert sb.exec(["test", "-e", MOUNT_PATH]).exit_code == 1
        assert sb.exec(["sh", "-c", "grep -c /opt/orchard /proc/mounts"]).stdout_text.strip() == "0"


def test_a_node_without_the_layer_refuses_the_create(tmp_path: Path) -> None:
    empty = tmp_path / "no-tools"
    empty.mkdir()
    with running_stack(tmp_path / "home", extra_env={"ORCHARD_TOOLS_DIR": str(empty)}) as bare:
        key = (bare.home / "dev-api-key").read_text().strip()
        with Orchard(bare.endpoint, key) as client:
            with pytest.raises(ToolsLayerNotBuiltError, match="make tools-layer") as err:
                client.sandboxes.create(tools=True, ttl=60)
            assert err.value.code == "FAILED_PRECONDITION"
            assert err.value.fault == "infrastructure"
            assert str(empty) in str(err.value)
            live = [s for s in client.sandboxes.list() if s.state in ("ready", "pending")]
            assert live == []
