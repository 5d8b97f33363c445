"""The sandbox's seccomp filter: allow by default, refuse the syscalls that reach kernel surface
a sandbox never needs.

Capabilities alone leave one big door open: without seccomp, code in a sandbox
can create a *user* namespace (no capability needed) and then mount
filesystems, make new network stacks and more inside it, which exposes far more
of the kernel than a task needs (measured: ``unshare -Urm`` + ``mount -t tmpfs``
worked in a sandbox before this filter). Docker's default profile closes it;
this one does the same with a deny list instead of a long allow list.

It refuses at least what Docker's default profile (moby ``profiles/seccomp``)
refuses a container without extra capabilities, and more:

- namespaces: CLONE_NEWUSER in clone/unshare (no new user namespace inside the
  sandbox), setns; ``clone3`` answers ENOSYS (its flags sit in a struct seccomp
  cannot read), so libc falls back to plain ``clone``;
- the mount API (old and new), pivot_root, swap, reboot, acct, quotactl;
- kernel surface a task never needs: io_uring (setup, enter, register: Docker
  dropped it from its default for its record of kernel bugs; ENOSYS, so libuv
  and friends fall back to threads), keyrings, bpf, perf_event_open,
  userfaultfd, module and kexec loading, lookup_dcookie, nfsservctl, sysfs,
  uselib, ustat, vm86, the old module calls;
- clocks: clock_settime, clock_adjtime, settimeofday, stime, adjtimex (the node's
  time is not the sandbox's to change);
- other processes' memory and handles: process_vm_readv/writev, kcmp,
  pidfd_getfd, name_to_handle_at / open_by_handle_at, and ptrace of pid 1
  (orchard-init, which is also non-dumpable);
- NUMA placement (mbind, set_mempolicy, get_mempolicy, move_pages, migrate_pages),
  ioperm / iopl: refused by Docker without CAP_SYS_NICE / CAP_SYS_RAWIO;
- socket families with no use in a sandbox and a record of kernel bugs: AF_ALG
  (the kernel crypto API) and AF_VSOCK (host <-> guest sockets), refused with
  EAFNOSUPPORT as a kernel without them would.

Every refused call is tested from inside a real sandbox
(``tests/isolation/test_seccomp.py``), next to real workloads (python threads,
subprocesses and asyncio, git, pytest) that must still run.
"""

from __future__ import annotations

from typing import Any

EPERM = 1
ENOSYS = 38
EAFNOSUPPORT = 97
CLONE_NEWUSER = 0x10000000
AF_ALG = 38
AF_VSOCK = 40
INIT_PID = 1

DENIED_SYSCALLS = [
    "acct",
    "add_key",
    "adjtimex",
    "bpf",
    "clock_adjtime",
    "clock_settime",
    "create_module",
    "delete_module",
    "finit_module",
    "fsconfig",
    "fsmount",
    "fsopen",
    "fspick",
    "get_kernel_syms",
    "get_mempolicy",
    "init_module",
    "ioperm",
    "iopl",
    "kcmp",
    "kexec_file_load",
    "kexec_load",
    "keyctl",
    "lookup_dcookie",
    "mbind",
    "migrate_pages",
    "mount",
    "mount_setattr",
    "move_mount",
    "move_pages",
    "name_to_handle_at",
    "nfsservctl",
    "open_by_handle_at",
    "open_tree",
    "perf_event_open",
    "pidfd_getfd",
    "pivot_root",
    "process_vm_readv",
    "process_vm_writev",
    "query_module",
    "quotactl",
    "quotactl_fd",
    "reboot",
    "request_key",
    "set_mempolicy",
    "setns",
    "settimeofday",
    "stime",
    "swapoff",
    "swapon",
    "sysfs",
    "_sysctl",
    "umount",
    "umount2",
    "uselib",
    "userfaultfd",
    "ustat",
    "vm86",
    "vm86old",
]
"""Refused with EPERM, as Docker's profile does for what it does not allow."""

UNAVAILABLE_SYSCALLS = ["clone3", "io_uring_enter", "io_uring_register", "io_uring_setup"]
"""Refused with ENOSYS ("this kernel has none"), so callers fall back to what they
would use on an older kernel instead of failing."""

REFUSED_SOCKET_FAMILIES = [AF_ALG, AF_VSOCK]


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
            {"names": UNAVAILABLE_SYSCALLS, "action": "SCMP_ACT_ERRNO", "errnoRet": ENOSYS},
            # ptrace(request, pid, ...): nobody attaches to orchard-init.
            {
                "names": ["ptrace"],
                "action": "SCMP_ACT_ERRNO",
                "errnoRet": EPERM,
                "args": [{"index": 1, "value": INIT_PID, "op": "SCMP_CMP_EQ"}],
            },
            *(
                {
                    "names": ["socket", "socketpair"],
                    "action": "SCMP_ACT_ERRNO",
                    "errnoRet": EAFNOSUPPORT,
                    "args": [{"index": 0, "value": family, "op": "SCMP_CMP_EQ"}],
                }
                for family in REFUSED_SOCKET_FAMILIES
            ),
        ],
    }
