"""The OCI runtime ``config.json`` of one sandbox container.

What each sandbox gets: its own pid, mount, network, uts, ipc and cgroup
namespaces; the overlay root prepared on the host; the standard /proc, /dev,
/dev/pts, /dev/shm, /dev/mqueue and read-only /sys mounts; Docker's masked and
read-only paths; ``noNewPrivileges``; a seccomp filter (``seccomp``); Docker's default capabilities minus NET_RAW and
MKNOD; cgroup limits for cpu (quota/period), memory (hard, no swap) and pids,
under ``orchard/<tenant group>`` (``tenant_group``); and orchard-init bind-mounted read-only at
``/.orchard/init`` as the container's process, listening on the socket passed
in as fd 3.
"""

from __future__ import annotations

import json
import os
import re
import resource
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .injected import InjectedRuntime
from .seccomp import seccomp_profile

INIT_PATH_IN_CONTAINER = "/.orchard/init"
INIT_LISTEN_FD = 3
CGROUP_PARENT = "orchard"
CPU_PERIOD_US = 100_000
# cgroup v1 cpu.shares (runc maps it to cpu.weight 10000 on v2): a sandbox starts and
# is torn down at the top weight, and runs at the default in between
# (``cgroups.set_cpu_weight``). Among hundreds of busy siblings a sandbox at the default
# weight gets a sliver of the CPU; runc's init and the dying processes of a teardown
# then hold kernel locks (cgroup attach, fork, mounts) for seconds while starved, and
# every other create on the machine waits behind them (measured: a create in another
# tenant's group took up to 2.2 s instead of ~0.05 s beside one starved create).
STARTING_CPU_SHARES = 262_144
RUNNING_CPU_SHARES = 1024
NOFILE_LIMIT = 65536

# Docker's default set minus NET_RAW (raw sockets: spoofing, ICMP tricks) and
# MKNOD (no device nodes; the device cgroup denies them anyway).
CAPABILITIES = [
    "CAP_CHOWN",
    "CAP_DAC_OVERRIDE",
    "CAP_FSETID",
    "CAP_FOWNER",
    "CAP_SETGID",
    "CAP_SETUID",
    "CAP_SETFCAP",
    "CAP_SETPCAP",
    "CAP_NET_BIND_SERVICE",
    "CAP_SYS_CHROOT",
    "CAP_KILL",
    "CAP_AUDIT_WRITE",
]

MASKED_PATHS = [
    "/proc/asound",
    "/proc/acpi",
    "/proc/kcore",
    "/proc/keys",
    "/proc/latency_stats",
    "/proc/timer_list",
    "/proc/timer_stats",
    "/proc/sched_debug",
    "/proc/scsi",
    "/sys/firmware",
    "/sys/devices/virtual/powercap",
]

READONLY_PATHS = [
    "/proc/bus",
    "/proc/fs",
    "/proc/irq",
    "/proc/sys",
    "/proc/sysrq-trigger",
]


@dataclass(frozen=True)
class ContainerLimits:
    cpu_millis: int
    memory_bytes: int
    pids: int


# A tenant's group name: "t-" + the tenant (the scheduler's tenant names are
# [A-Za-z0-9][A-Za-z0-9._-]{0,63}); unclaimed pool members share POOL_GROUP.
TENANT_GROUP_RE = re.compile(r"^t-[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
POOL_GROUP = "pool"


def tenant_group(tenant: str) -> str:
    """The cgroup under ``orchard`` that holds ``tenant``'s sandboxes (one level of fairness).

    The kernel shares CPU between sibling cgroups by weight, each group equal: with
    every sandbox a direct child of ``orchard``, a fresh sandbox got 1/N of the
    sandboxes' CPU while N others were busy (N = 300: ~2.4 s for a ``runc run`` whose
    init is already in its cgroup; measured). Grouped by tenant, another tenant's
    busy sandboxes are one sibling, whatever their count (same test: ~36 ms).
    """
    if not tenant:
        return POOL_GROUP
    group = f"t-{tenant}"
    if not TENANT_GROUP_RE.match(group):
        raise ValueError(f"tenant {tenant[:80]!r} cannot name a cgroup")
    return group


def cgroups_path(sandbox_id: str, tenant: str = "") -> str:
    """runc's cgroupsPath: absolute, so each v1 controller gets ``<mount>/orchard/<group>/<id>``."""
    return f"/{CGROUP_PARENT}/{tenant_group(tenant)}/{sandbox_id}"


def cpu_quota_us(cpu_millis: int) -> int:
    # The kernel refuses quotas under 1 ms.
    return max(1000, cpu_millis * CPU_PERIOD_US // 1000)


def nofile_limit() -> int:
    """Open-file limit for the sandbox: 65536, or the host's hard limit if lower.

    runc sets rlimits after the capabilities that could raise them are gone, so
    asking for more than the host process has fails the create.
    """
    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY:
        return NOFILE_LIMIT
    return min(NOFILE_LIMIT, hard)


def _mount(destination: str, fstype: str, source: str, options: list[str]) -> dict[str, Any]:
    return {"destination": destination, "type": fstype, "source": source, "options": options}


def build_config(
    *,
    sandbox_id: str,
    rootfs: Path,
    init_binary: Path,
    limits: ContainerLimits,
    netns_path: str | None = None,
    injected: InjectedRuntime | None = None,
    gvisor: bool = False,
    tenant: str = "",
    userns: tuple[str, list[dict[str, int]]] | None = None,
) -> dict[str, Any]:
    """The OCI runtime spec (1.0.2) for one sandbox.

    ``injected``: the sandbox runs its own executor from the bundle
    (``injected.py``): its entry is the process and the bundle and run folder
    are mounted instead of the host's orchard-init. ``gvisor``: for runsc
    (``runsc.py``), which takes no fd 3 and no cgroup mount: orchard-init binds
    its socket inside and the host's cgroups are not mounted. ``tenant``: whose
    sandbox it is, for its cgroup's place (``tenant_group``). ``userns``: (path of
    the user namespace made for the sandbox, its id mapping), see ``userns.py``.
    """
    network_ns: dict[str, str] = {"type": "network"}
    if netns_path:
        network_ns["path"] = netns_path
    caps = list(CAPABILITIES)
    nofile = nofile_limit()
    config: dict[str, Any] = {
        "ociVersion": "1.0.2",
        "process": {
            "terminal": False,
            "user": {"uid": 0, "gid": 0},
            "args": (
                injected.process_args(None if gvisor else INIT_LISTEN_FD)
                if injected is not None
                else [INIT_PATH_IN_CONTAINER, "--listen-fd", str(INIT_LISTEN_FD)]
            ),
            # Only init's own environment; commands get sandbox.json's env.
            "env": ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"],
            "cwd": "/",
            "capabilities": {
                "bounding": caps,
                "effective": caps,
                "permitted": caps,
            },
            "rlimits": [{"type": "RLIMIT_NOFILE", "hard": nofile, "soft": nofile}],
            "noNewPrivileges": True,
            "oomScoreAdj": 500,
        },
        "root": {"path": str(rootfs), "readonly": False},
        "hostname": sandbox_id,
        "mounts": [
            _mount("/proc", "proc", "proc", ["nosuid", "noexec", "nodev"]),
            _mount(
                "/dev",
                "tmpfs",
                "tmpfs",
                ["nosuid", "strictatime", "mode=755", "size=65536k"],
            ),
            _mount(
                "/dev/pts",
                "devpts",
                "devpts",
                ["nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620", "gid=5"],
            ),
            _mount(
                "/dev/shm",
                "tmpfs",
                "shm",
                ["nosuid", "noexec", "nodev", "mode=1777", "size=65536k"],
            ),
            _mount("/dev/mqueue", "mqueue", "mqueue", ["nosuid", "noexec", "nodev"]),
            _mount("/sys", "sysfs", "sysfs", ["nosuid", "noexec", "nodev", "ro"]),
            *(
                injected.mounts(cgroupfs=not gvisor)
                if injected is not None
                else [
                    _mount(
                        INIT_PATH_IN_CONTAINER,
                        "bind",
                        str(init_binary),
                        ["bind", "ro", "nosuid", "nodev"],
                    )
                ]
            ),
        ],
        "linux": {
            "namespaces": [
                {"type": "pid"},
                {"type": "ipc"},
                {"type": "uts"},
                {"type": "mount"},
                {"type": "cgroup"},
                network_ns,
            ],
            "cgroupsPath": cgroups_path(sandbox_id, tenant),
            "resources": {
                "devices": [{"allow": False, "access": "rwm"}],
                "memory": {"limit": limits.memory_bytes, "swap": limits.memory_bytes},
                "cpu": {
                    "quota": cpu_quota_us(limits.cpu_millis),
                    "period": CPU_PERIOD_US,
                    "shares": STARTING_CPU_SHARES,
                },
                "pids": {"limit": limits.pids},
            },
            "seccomp": seccomp_profile(),
            "maskedPaths": MASKED_PATHS,
            "readonlyPaths": READONLY_PATHS,
        },
    }
    if userns is not None:
        path, mapping = userns
        config["linux"]["namespaces"].append({"type": "user", "path": path})
        config["linux"]["uidMappings"] = mapping
        config["linux"]["gidMappings"] = mapping
        # runc 1.1 sets rlimits from inside the namespace, where raising a hard limit
        # needs CAP_SYS_RESOURCE of the host (EPERM); the sandbox inherits runc's.
        del config["process"]["rlimits"]
    return config


def write_config(bundle: Path, config: dict[str, Any]) -> None:
    """Write ``bundle/config.json`` (runc reads the bundle's config.json)."""
    tmp = bundle / "config.json.tmp"
    with open(tmp, "w", encoding="utf-8") as out:
        json.dump(config, out)
    os.replace(tmp, bundle / "config.json")
