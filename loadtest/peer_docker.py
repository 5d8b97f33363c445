"""`docker exec` as a benchmark peer: a private dockerd, the default image, `docker exec ID true`.

targets.md compares Orchard's exec with `docker exec` (Docker 20.10 from
Debian's ``docker.io``, started by hand). This starts its own ``dockerd`` as
root with everything under one temporary folder (data root, exec root, pid
file, its own containerd) and a socket in /tmp, with no bridge and no
iptables changes, imports the default image's rootfs (the unpacked layer under
/var/lib/orchard/images), runs one container with ``--network none`` and
times N sequential ``docker exec ID true`` through the CLI, the way a user
(or SWE-agent's docker deployment) calls it. Afterwards it removes the
container, stops dockerd by its pid and deletes its folder.

When dockerd cannot run here (not root, not installed, it fails to start),
the result is ``{"skipped": "<why>"}`` rather than an error.

    python loadtest/peer_docker.py --n 100     # prints JSON
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from loadtest.peer_swerex import local_files, percentiles

DOCKERD = "/usr/sbin/dockerd"
# Debian's client; /usr/local/bin may hold an unrelated `docker`.
DOCKER_CLI = "/usr/bin/docker"
DEFAULT_ROOTFS = Path("/var/lib/orchard/images/debian+bookworm/layers/0")
IMAGE = "orchard-bench-peer:latest"
START_TIMEOUT_SECONDS = 60.0


class DockerUnavailable(Exception):
    """dockerd cannot be started or used on this machine."""


def _cli(sock: str, *args: str, timeout: float = 120.0, stdin: Any = None) -> str:
    result = subprocess.run(
        [DOCKER_CLI, "-H", f"unix://{sock}", *args],
        stdin=stdin,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    if result.returncode != 0:
        raise DockerUnavailable(f"docker {args[0]} failed: {result.stderr.strip()[-400:]}")
    return result.stdout.strip()


@contextlib.contextmanager
def private_dockerd() -> Iterator[str]:
    """A dockerd of our own; yields its socket path. Stopped by pid, its files removed."""
    if os.geteuid() != 0:
        raise DockerUnavailable("dockerd needs root")
    for binary in (DOCKERD, DOCKER_CLI):
        if not os.access(binary, os.X_OK):
            raise DockerUnavailable(f"{binary} is not installed (Debian package docker.io)")
    root = Path(tempfile.mkdtemp(prefix="orchard-dockerd-", dir="/tmp"))
    sock = str(root / "docker.sock")
    log = open(root / "dockerd.log", "wb")  # noqa: SIM115 - dockerd keeps it
    proc = subprocess.Popen(
        [
            DOCKERD,
            "-H",
            f"unix://{sock}",
            "--data-root",
            str(root / "data"),
            "--exec-root",
            str(root / "exec"),
            "--pidfile",
            str(root / "dockerd.pid"),
            "--bridge",
            "none",
            "--iptables=false",
            "--ip-masq=false",
            "--ip-forward=false",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + START_TIMEOUT_SECONDS
        while True:
            if proc.poll() is not None:
                tail = (root / "dockerd.log").read_text(errors="replace")[-600:]
                raise DockerUnavailable(f"dockerd exited ({proc.returncode}): {tail}")
            if os.path.exists(sock):
                with contextlib.suppress(DockerUnavailable, subprocess.TimeoutExpired):
                    _cli(sock, "version", timeout=5)
                    break
            if time.monotonic() > deadline:
                raise DockerUnavailable("dockerd did not answer within 60 s")
            time.sleep(0.2)
        yield sock
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)
        log.close()
        _remove_tree(root)


def _remove_tree(root: Path) -> None:
    """Unmount whatever dockerd left mounted under ``root``, then delete it."""
    with open("/proc/self/mounts") as f:
        mounts = [line.split()[1] for line in f]
    for mount in sorted((m for m in mounts if m.startswith(str(root))), reverse=True):
        subprocess.run(["umount", "-l", mount], check=False, capture_output=True)
    shutil.rmtree(root, ignore_errors=True)


def _cp_figures(sock: str, container: str, file_mib: int, files: int) -> dict[str, Any]:
    """``docker cp`` of one file and of a tree, each way (the local side on /dev/shm).

    The container's writable layer is dockerd's overlay2 under its data root
    in /tmp, i.e. on this machine's disk.
    """
    local = Path(tempfile.mkdtemp(prefix="docker-cp-", dir="/dev/shm"))
    try:
        big, tree = local_files(local, file_mib, files)

        def timed_cp(src: str, dst: str) -> float:
            t0 = time.perf_counter()
            _cli(sock, "cp", src, dst, timeout=600)
            return time.perf_counter() - t0

        mb = file_mib * (1 << 20) / 1e6
        up_file = timed_cp(str(big), f"{container}:/tmp/big.bin")
        down_file = timed_cp(f"{container}:/tmp/big.bin", str(local / "big.back"))
        up_tree = timed_cp(str(tree), f"{container}:/tmp/tree")
        down_tree = timed_cp(f"{container}:/tmp/tree", str(local / "tree.back"))
        back = sum(len(names) for _, _, names in os.walk(local / "tree.back"))
        assert back == files, back
        return {
            "upload_MBps": round(mb / up_file, 1),
            "download_MBps": round(mb / down_file, 1),
            "upload_files_per_s": round(files / up_tree, 1),
            "download_files_per_s": round(files / down_tree, 1),
        }
    finally:
        shutil.rmtree(local, ignore_errors=True)


def measure_docker(
    n: int, rootfs: Path = DEFAULT_ROOTFS, file_mib: int = 0, files: int = 0
) -> dict[str, Any]:
    """p50/p90/p99 of ``docker exec ID true`` (and ``docker cp`` figures when ``files``),
    or ``{"skipped": why}``."""
    try:
        with private_dockerd() as sock:
            if not rootfs.is_dir():
                raise DockerUnavailable(f"no image rootfs at {rootfs}")
            tar = subprocess.Popen(["tar", "-C", str(rootfs), "-c", "."], stdout=subprocess.PIPE)
            try:
                _cli(sock, "import", "-", IMAGE, stdin=tar.stdout, timeout=600)
            finally:
                tar.wait()
            container = _cli(
                sock, "run", "-d", "--network", "none", IMAGE, "sleep", "infinity", timeout=120
            )
            try:
                exec_true = [DOCKER_CLI, "-H", f"unix://{sock}", "exec", container, "true"]
                for _ in range(5):
                    subprocess.run(exec_true, check=True, capture_output=True)
                samples = []
                for _ in range(n):
                    t0 = time.perf_counter()
                    subprocess.run(exec_true, check=True, capture_output=True)
                    samples.append((time.perf_counter() - t0) * 1000)
                version = _cli(sock, "version", "--format", "{{.Server.Version}}")
                cp = _cp_figures(sock, container, file_mib, files) if files > 0 else None
            finally:
                with contextlib.suppress(DockerUnavailable, subprocess.TimeoutExpired):
                    _cli(sock, "rm", "-f", container, timeout=60)
            out: dict[str, Any] = {"exec": percentiles(samples), "server_version": version}
            if cp is not None:
                out["cp"] = cp
            return out
    except (DockerUnavailable, OSError, subprocess.SubprocessError) as exc:
        return {"skipped": str(exc)}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--n", type=int, default=100)
    args = parser.parse_args()
    print(json.dumps(measure_docker(args.n), indent=2))


if __name__ == "__main__":
    main()
