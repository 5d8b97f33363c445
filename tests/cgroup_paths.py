"""Where a sandbox's cgroups are on this host, for tests that read or check them.

The local backend puts each sandbox at ``<mount>/orchard/<tenant group>/<id>``
(``oci_config.tenant_group``); these helpers look in every group (and directly
under ``orchard``), so a check that a sandbox's cgroups are gone cannot pass
just because the layout moved.
"""

from __future__ import annotations

import glob
from pathlib import Path

CGROUP_ROOT = "/sys/fs/cgroup"


def sandbox_cgroup_dirs(sandbox_id: str, controller: str = "*") -> list[str]:
    """Every existing cgroup folder of the sandbox (all controllers unless one is named)."""
    return sorted(
        glob.glob(f"{CGROUP_ROOT}/{controller}/orchard/{sandbox_id}")
        + glob.glob(f"{CGROUP_ROOT}/{controller}/orchard/*/{sandbox_id}")
    )


def sandbox_cgroup(controller: str, sandbox_id: str) -> Path:
    """The sandbox's cgroup folder in ``controller``'s hierarchy; it must exist (and be one)."""
    found = sandbox_cgroup_dirs(sandbox_id, controller)
    assert len(found) == 1, f"{controller} cgroup of {sandbox_id}: {found}"
    return Path(found[0])


def sandbox_cgroup_map(controller: str) -> dict[str, Path]:
    """Sandbox id -> its cgroup folder in ``controller``'s hierarchy, for every sandbox
    there now (one pass over the groups, for callers that look up many ids)."""
    found: dict[str, Path] = {}
    for pattern in (
        f"{CGROUP_ROOT}/{controller}/orchard/*",
        f"{CGROUP_ROOT}/{controller}/orchard/*/*",
    ):
        for path in glob.glob(pattern):
            name = path.rsplit("/", 1)[-1]
            if name.startswith("sb-"):
                found[name] = Path(path)
    return found


def count_sandbox_cgroups(sandbox_ids: set[str] | list[str]) -> int:
    """How many cgroup folders (all controllers) the given sandboxes still have."""
    wanted = set(sandbox_ids)
    return sum(
        1
        for pattern in (f"{CGROUP_ROOT}/*/orchard/*", f"{CGROUP_ROOT}/*/orchard/*/*")
        for path in glob.glob(pattern)
        if path.rsplit("/", 1)[-1] in wanted
    )


def cgroup_names_a_sandbox(proc_cgroup: str, sandbox_ids: set[str]) -> bool:
    """Whether a ``/proc/<pid>/cgroup`` text puts the process in one of the sandboxes."""
    return any(line.rsplit("/", 1)[-1] in sandbox_ids for line in proc_cgroup.splitlines())
