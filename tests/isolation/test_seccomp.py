"""The seccomp profile from inside a real sandbox: every refused call is refused, real work runs.

A probe script (python3 + ctypes, inside a sandbox of a real ``orchard up``)
makes each call the profile refuses and reports the errno it got. Arguments are
chosen so that a call the filter let through would mostly answer differently
(a new fd, 0, EINVAL, EFAULT): io_uring_setup returned an fd before the
profile refused it, settimeofday(NULL, NULL) returns 0, socket(AF_ALG) a socket.
Real workloads (threads, processes, asyncio subprocesses, git, pytest) must
still pass inside the same profile.
"""

from __future__ import annotations

import json
import platform
from collections.abc import Iterator

import pytest
from orchard.scheduler.backends.local.seccomp import (
    DENIED_SYSCALLS,
    EAFNOSUPPORT,
    ENOSYS,
    EPERM,
    REFUSED_SOCKET_FAMILIES,
    UNAVAILABLE_SYSCALLS,
)

from orchard import Orchard, Sandbox
from tests.stack import REQUIRES_STACK, Stack, running_stack

pytestmark = REQUIRES_STACK

# x86_64 numbers (asm/unistd_64.h) of the calls the profile names; the i386-only ones
# (stime, umount, vm86, vm86old) have none here.
X86_64 = {
    "acct": 163, "add_key": 248, "adjtimex": 159, "bpf": 321, "clock_adjtime": 305,
    "clock_settime": 227, "create_module": 174, "delete_module": 176, "finit_module": 313,
    "fsconfig": 431, "fsmount": 432, "fsopen": 430, "fspick": 433, "get_kernel_syms": 177,
    "get_mempolicy": 239, "init_module": 175, "ioperm": 173, "iopl": 172, "kcmp": 312,
    "kexec_file_load": 320, "kexec_load": 246, "keyctl": 250, "lookup_dcookie": 212,
    "mbind": 237, "migrate_pages": 256, "mount": 165, "mount_setattr": 442, "move_mount": 429,
    "move_pages": 279, "name_to_handle_at": 303, "nfsservctl": 180, "open_by_handle_at": 304,
    "open_tree": 428, "perf_event_open": 298, "pidfd_getfd": 438, "pivot_root": 155,
    "process_vm_readv": 310, "process_vm_writev": 311, "query_module": 178, "quotactl": 179,
    "quotactl_fd": 443, "reboot": 169, "request_key": 249, "set_mempolicy": 238, "setns": 308,
    "settimeofday": 164, "swapoff": 168, "swapon": 167, "sysfs": 139, "_sysctl": 156,
    "umount2": 166, "uselib": 134, "userfaultfd": 323, "ustat": 136,
    "clone3": 435, "io_uring_enter": 426, "io_uring_register": 427, "io_uring_setup": 425,
    "ptrace": 101, "unshare": 272,
}  # fmt: skip
I386_ONLY = {"stime", "umount", "vm86", "vm86old"}

PROBE = r"""
import ctypes, json, os, socket, sys
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
calls = json.loads(sys.argv[1])
out = {}
buf = ctypes.create_string_buffer(4096)
for name, (nr, args) in calls.items():
    # io_uring_setup(entries, params): a real params struct, so an allowed call returns an fd.
    real = [ctypes.addressof(buf) if a == "BUF" else a for a in args]
    ctypes.set_errno(0)
    rc = libc.syscall(ctypes.c_long(nr), *[ctypes.c_long(a) for a in real])
    out[name] = {"rc": rc, "errno": ctypes.get_errno()}
for family in json.loads(sys.argv[2]):
    try:
        socket.socket(family, socket.SOCK_SEQPACKET).close()
        out[f"socket({family})"] = {"rc": 0, "errno": 0}
    except OSError as exc:
        out[f"socket({family})"] = {"rc": -1, "errno": exc.errno}
print(json.dumps(out))
"""

# Arguments for calls whose zero arguments would be harmless or ambiguous.
ARGS = {
    "io_uring_setup": [1, "BUF"],  # would return an io_uring fd if allowed
    "settimeofday": [0, 0],  # would return 0 if allowed (both NULL: sets nothing)
    "clock_settime": [-1, 0],  # would be EINVAL (bad clock) if allowed
    "ptrace": [16, 1],  # PTRACE_ATTACH to pid 1
    "unshare": [0x10000000],  # CLONE_NEWUSER
    "process_vm_readv": [1, "BUF", 1, "BUF", 1, 0],
    "kcmp": [1, 1, 0, 0, 0],
    "reboot": [0, 0, 0, 0],  # bad magic: EINVAL if it were allowed and capable
}


@pytest.fixture(scope="module")
def sandbox(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sandbox]:
    with running_stack(tmp_path_factory.mktemp("seccomp") / "home") as stack:
        yield from _sandbox(stack)


def _sandbox(stack: Stack) -> Iterator[Sandbox]:
    key = (stack.home / "dev-api-key").read_text().strip()
    with Orchard(stack.endpoint, key) as client, client.sandboxes.create(ttl=600) as sb:
        yield sb


def test_every_refused_call_is_refused(sandbox: Sandbox) -> None:
    assert platform.machine() == "x86_64", "the probe's syscall numbers are x86_64's"
    names = [n for n in [*DENIED_SYSCALLS, *UNAVAILABLE_SYSCALLS] if n not in I386_ONLY]
    assert set(names) <= set(X86_64), set(names) - set(X86_64)
    calls = {n: (X86_64[n], ARGS.get(n, [0, 0, 0, 0, 0, 0])) for n in [*names, "ptrace", "unshare"]}
    r = sandbox.exec(
        ["python3", "-c", PROBE, json.dumps(calls), json.dumps(REFUSED_SOCKET_FAMILIES)],
        timeout=60,
    )
    assert r.exit_code == 0, r.stderr_text
    got = json.loads(r.stdout)
    expected = {n: EPERM for n in calls} | {n: ENOSYS for n in UNAVAILABLE_SYSCALLS}
    expected |= {f"socket({f})": EAFNOSUPPORT for f in REFUSED_SOCKET_FAMILIES}
    wrong = {
        name: got[name]
        for name, errno in expected.items()
        if got[name]["rc"] != -1 or got[name]["errno"] != errno
    }
    assert not wrong, f"let through or refused differently: {wrong}"


def test_real_workloads_still_run(sandbox: Sandbox) -> None:
    script = r"""
set -e
python3 - <<'PY'
import asyncio, concurrent.futures, multiprocessing, threading, subprocess
t = threading.Thread(target=lambda: None); t.start(); t.join()
with multiprocessing.Pool(2) as pool:
    assert pool.map(abs, [-1, -2]) == [1, 2]
with concurrent.futures.ProcessPoolExecutor(2) as ex:
    assert list(ex.map(abs, [-3])) == [3]
async def main():
    p = await asyncio.create_subprocess_exec("echo", "sub", stdout=asyncio.subprocess.PIPE)
    out, _ = await p.communicate()
    assert out == b"sub\n"
asyncio.run(main())
assert subprocess.run(["sh", "-c", "exit 3"]).returncode == 3
print("python ok")
PY
mkdir -p /work/repo && cd /work/repo
git init -q && git config user.email t@t && git config user.name t
printf 'def add(a, b):\n    return a + b\n' > calc.py
printf 'from calc import add\n\ndef test_add():\n    assert add(2, 2) == 4\n' > test_calc.py
git add -A && git commit -qm init && git log --oneline | wc -l
python3 -m pytest -q -p no:cacheprovider test_calc.py 2>&1 | tail -1
"""
    r = sandbox.exec(["bash", "-c", script], timeout=120)
    assert r.exit_code == 0, (r.stdout_text, r.stderr_text)
    assert r.stdout_text.splitlines()[0] == "python ok"
    assert r.stdout_text.splitlines()[1].strip() == "1"
    assert "1 passed" in r.stdout_text.splitlines()[-1]
