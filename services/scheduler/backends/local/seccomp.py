"""The sandbox's seccomp filter: allow by default, refuse the syscalls that reach kernel surface
a sandbox never needs.

Capabilities alone leave one big door open: without seccomp, code in a sandbox
can create a *user* namespace (no capability needed) and then mount
filesystems, make new network stacks and more inside it, which exposes far more
of the kernel than a task needs (measured: ``unshare -Urm`` + ``mount -t tmpfs``
worked in a sandbox before this filter). Docker's default profile closes it;
this one does the same with a short deny list instead of a long allow list:
namespace creation with CLONE_NEWUSER (clone, unshare), setns, the mount API,
keyrings, bpf, perf, userfaultfd, module and kexec loading, swap, reboot, acct,
quotactl and open_by_handle_at. ``clone3`` answers ENOSYS (its flags sit in a
struct seccomp cannot read), so libc falls back to plain ``clone``.
"""

from __future__ import annotations

from typing import Any

EPERM = 1
ENOSYS = 38
CLONE_NEWUSER = 0x10000000

DENIED_SYSCALLS = [
    "acct",
    "add_key",
    "bpf",
    "delete_module",
    "finit_module",
    "fsconfig",
    "fsmount",
    "fsopen",
    "fspick",
    "init_module",
    "kexec_file_load",
    "kexec_load",
    "keyctl",
    "lookup_dcookie",
    "mount",
    "mount_setattr",
    "move_mount",
    "open_by_handle_at",
    "open_tree",
    "perf_event_open",
    "pivot_root",
    "quotactl",
    "reboot",
    "request_key",
    "setns",
    "swapoff",
    "swapon",
    "umount2",
    "userfaultfd",
]


def seccomp_profile() -> dict[str, Any]:
    """The ``linux.seccomp`` section of the OCI config."""
    # clone(flags, ...) and unshare(flags): refused when flags has CLONE_NEWUSER.
    new_user_ns = [
        {"index": 0, "value": CLONE_NEWUSER, "valueTwo": CLONE_NEWUSER, "op": "SCMP_CMP_MASKED_EQ"}
    ]
    return {
        "defaultAction": "SCMP_ACT_ALLOW",
        "architectures": ["SCMP_ARCH_X86_64", "SCMP_ARCH_X86", "SCMP_ARCH_X32"],
        "syscalls": [
            {"names": DENIED_SYSCALLS, "action": "SCMP_ACT_ERRNO", "errnoRet": EPERM},
            {
                "names": ["clone", "unshare"],
                "action": "SCMP_ACT_ERRNO",
                "errnoRet": EPERM,
                "args": new_user_ns,
            },
            {"names": ["clone3"], "action": "SCMP_ACT_ERRNO", "errnoRet": ENOSYS},
        ],
    }
