"""What an injected sandbox's capped run folder adds to its create and delete, directly.

``run_folder.mount`` (mkdir + mount(2) of the 4 MiB tmpfs) and ``run_folder.unmount``
(umount2), timed apart, ``--cycles`` times in a temp folder under /var/tmp (root
only). The rest of what it costs is not here: the mount sits in the host's mount
table while the sandbox lives, so every later ``runc run`` copies and parses one
more entry per live injected sandbox (``scratch.py`` measured +21 ms of CPU per
create per 1000 host mounts); ``loadtest.bench_userns --injected`` times whole
creates. Prints one JSON object.

    .venv/bin/python -m loadtest.bench_run_folder [--cycles 500]
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import time
from pathlib import Path

from orchard.scheduler.backends.local import run_folder

from loadtest.peer_swerex import percentiles


def measure(cycles: int) -> dict[str, dict[str, float]]:
    parent = Path(tempfile.mkdtemp(prefix="oe-bench-run-", dir="/var/tmp"))
    mounts, unmounts = [], []
    try:
        for i in range(cycles):
            run = parent / f"run{i}"
            start = time.perf_counter()
            run_folder.mount(run, 100000)
            mounted = time.perf_counter()
            run_folder.unmount(run)
            mounts.append((mounted - start) * 1000)
            unmounts.append((time.perf_counter() - mounted) * 1000)
            run.rmdir()
    finally:
        for leftover in parent.iterdir():
            run_folder.unmount(leftover)
        shutil.rmtree(parent, ignore_errors=True)
    return {"mount": percentiles(mounts), "unmount": percentiles(unmounts)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--cycles", type=int, default=500)
    args = parser.parse_args()
    print(json.dumps({"cycles": args.cycles, **measure(args.cycles)}, indent=2))


if __name__ == "__main__":
    main()
