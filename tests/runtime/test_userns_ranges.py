"""The per-sandbox host uid ranges of user namespaces (``backends/local/userns.py``).

Pure file logic, no containers: claims never collide, are released on delete, and
survive a scheduler restart (a new ``UidRanges`` over the same claims folder).
The namespaces themselves run in tests/reliability/test_hostile_userns.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from orchard.common.layout import SandboxLayout
from services.scheduler.backends.base import BackendError
from services.scheduler.backends.local import oci_config, userns
from services.scheduler.backends.local.injected import (
    BUNDLE_IN_CONTAINER,
    RUN_IN_CONTAINER,
    InjectedRuntime,
)


def _sandbox(home: Path, name: str) -> Path:
    folder = home / "sandboxes" / name
    folder.mkdir(parents=True)
    return folder


def _ranges(home: Path, count: int = 4) -> userns.UidRanges:
    return userns.UidRanges(home / "run" / userns.CLAIMS_DIR, 1 << 20, count)


def test_claims_are_distinct_and_released(tmp_path: Path) -> None:
    ranges = _ranges(tmp_path)
    one, two = (ranges.claim(_sandbox(tmp_path, n)) for n in ("sb-one", "sb-two"))
    assert one.host_base != two.host_base
    assert abs(one.host_base - two.host_base) >= userns.RANGE_SIZE
    assert one.mapping == [{"containerID": 0, "hostID": one.host_base, "size": 65536}]
    assert ranges.of_sandbox(tmp_path / "sandboxes" / "sb-one") == one
    ranges.release_index(one.index, "sb-two")  # not its claim: kept
    assert (ranges.claims / str(one.index)).exists()
    ranges.release_index(one.index, "sb-one")
    ranges.release_index(one.index, "sb-one")  # idempotent
    assert not (ranges.claims / str(one.index)).exists()


def test_all_ranges_in_use_is_resource_exhausted(tmp_path: Path) -> None:
    ranges = _ranges(tmp_path, count=2)
    ranges.claim(_sandbox(tmp_path, "sb-a"))
    ranges.claim(_sandbox(tmp_path, "sb-b"))
    with pytest.raises(BackendError) as caught:
        ranges.claim(_sandbox(tmp_path, "sb-c"))
    assert caught.value.reason == "RESOURCE_EXHAUSTED"


def test_a_restarted_scheduler_keeps_live_claims_and_drops_stale_ones(tmp_path: Path) -> None:
    first = _ranges(tmp_path)
    live = first.claim(_sandbox(tmp_path, "sb-live"))
    gone_dir = _sandbox(tmp_path, "sb-gone")
    gone = first.claim(gone_dir)
    for entry in gone_dir.iterdir():
        entry.unlink()
    gone_dir.rmdir()  # its folder went, its claim stayed (a delete killed half-way)
    restarted = _ranges(tmp_path)
    restarted.recover(tmp_path / "sandboxes")
    assert (restarted.claims / str(live.index)).exists()
    assert not (restarted.claims / str(gone.index)).exists()
    fresh = restarted.claim(_sandbox(tmp_path, "sb-new"))
    assert fresh.index != live.index


def test_ranges_past_the_largest_uid_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="largest uid"):
        userns.UidRanges(tmp_path / "claims", 2**32 - userns.RANGE_SIZE, 2)


def test_settings_from_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ORCHARD_USERNS", "yes")
    with pytest.raises(ValueError, match="ORCHARD_USERNS"):
        userns.enabled_from_env()
    monkeypatch.setenv("ORCHARD_USERNS", "1")
    assert userns.enabled_from_env()
    monkeypatch.setenv("ORCHARD_USERNS_UID_BASE", "-5")
    with pytest.raises(ValueError, match="ORCHARD_USERNS_UID_BASE"):
        userns.uid_base_from_env()


def test_the_oci_config_joins_the_namespace_with_its_mapping(tmp_path: Path) -> None:
    mapping = userns.UidRange(3, 1 << 30).mapping
    config = oci_config.build_config(
        sandbox_id="sb-x",
        rootfs=tmp_path,
        init_binary=tmp_path / "init",
        limits=oci_config.ContainerLimits(500, 1 << 28, 64),
        userns=("/proc/7/ns/user", mapping),
    )
    assert {"type": "user", "path": "/proc/7/ns/user"} in config["linux"]["namespaces"]
    assert config["linux"]["uidMappings"] == config["linux"]["gidMappings"] == mapping
    plain = oci_config.build_config(
        sandbox_id="sb-x",
        rootfs=tmp_path,
        init_binary=tmp_path / "init",
        limits=oci_config.ContainerLimits(500, 1 << 28, 64),
    )
    assert all(ns["type"] != "user" for ns in plain["linux"]["namespaces"])
    assert "uidMappings" not in plain["linux"]


def test_the_setting_defaults_on_and_1_requires_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ORCHARD_USERNS", raising=False)
    assert userns.enabled_from_env() and not userns.required_from_env()
    monkeypatch.setenv("ORCHARD_USERNS", "0")
    assert not userns.enabled_from_env() and not userns.required_from_env()
    monkeypatch.setenv("ORCHARD_USERNS", "1")
    assert userns.enabled_from_env() and userns.required_from_env()


def test_runc_is_pointed_at_the_reachable_alias_not_the_home(tmp_path: Path) -> None:
    """runc resolves these paths as the sandbox's uid: the root, the init binary and the
    bind sources in the sandbox folder go through /run/orchard-userns/<id>; the rest
    (kernel filesystems) is left alone."""
    sandbox_dir = tmp_path / "home" / "sandboxes" / "sb-x"
    init = tmp_path / "home" / "bin" / "orchard-init"
    config = oci_config.build_config(
        sandbox_id="sb-x",
        rootfs=sandbox_dir / "rootfs",
        init_binary=init,
        limits=oci_config.ContainerLimits(500, 1 << 28, 64),
        userns=("/proc/7/ns/user", userns.UidRange(3, 1 << 30).mapping),
    )
    config["mounts"].append(
        {
            "destination": "/etc/resolv.conf",
            "type": "bind",
            "source": str(sandbox_dir / "resolv.conf"),
        }
    )
    userns.reroute(config, sandbox_dir, init)
    alias = userns.REACHABLE_ROOT / "sb-x"
    assert config["root"]["path"] == str(alias / "rootfs")
    sources = {m["destination"]: m["source"] for m in config["mounts"]}
    assert sources["/etc/resolv.conf"] == str(alias / "resolv.conf")
    assert sources[oci_config.INIT_PATH_IN_CONTAINER] == str(alias / userns.INIT_IN_BUNDLE)
    assert sources["/proc"] == "proc"
    assert not any(str(tmp_path) in source for source in sources.values())


def test_reroute_moves_an_injected_sandboxs_bundle_and_run_folder(tmp_path: Path) -> None:
    """An injected sandbox: the bundle (outside the folder, perhaps under 0700 parents)
    and the run folder go through the alias too; nothing left points at the home."""
    sandbox_dir = tmp_path / "home" / "sandboxes" / "sb-i"
    bundle = tmp_path / "home" / "bundles" / "abc"
    inject = InjectedRuntime(bundle, SandboxLayout(sandbox_dir, "sb-i"))
    config = oci_config.build_config(
        sandbox_id="sb-i",
        rootfs=sandbox_dir / "rootfs",
        init_binary=tmp_path / "home" / "bin" / "orchard-init",
        limits=oci_config.ContainerLimits(500, 1 << 28, 64),
        injected=inject,
        userns=("/proc/7/ns/user", userns.UidRange(3, 1 << 30).mapping),
    )
    userns.reroute(config, sandbox_dir, tmp_path / "home" / "bin" / "orchard-init", bundle)
    alias = userns.REACHABLE_ROOT / "sb-i"
    sources = {m["destination"]: m["source"] for m in config["mounts"]}
    assert sources[BUNDLE_IN_CONTAINER] == str(alias / userns.EXECUTOR_BUNDLE_IN_FOLDER)
    assert sources[RUN_IN_CONTAINER] == str(alias / "run")
    assert not any(str(tmp_path) in source for source in sources.values())
