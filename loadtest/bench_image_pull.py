"""``orchard image pull`` against ``skopeo copy`` to a dir, from the same loopback registry.

One real ``docker-registry`` (anonymous, storage in a temp folder) holds one image of
``--layers`` gzip layers, each ``--layer-mb`` MB of which half is random and half text
(so gzip has work on both sides), pushed with skopeo from an OCI layout built here.
Then ``--rounds`` alternations of:

- ``orchard image pull`` as a CLI process into an empty images folder (download, verify,
  unpack every layer; ``--parallel`` default 4), wall time of the process;
- ``skopeo copy docker://... dir:...`` into an empty folder (download and verify only:
  skopeo does not unpack), wall time of the process;
- ``orchard image pull`` again into the now-full folder under another name (nothing to
  download or unpack: the cost of the manifest round trips and the commit).

Prints one JSON object; p50 over the rounds.

    .venv/bin/python -m loadtest.bench_image_pull [--layers 4 --layer-mb 12 --rounds 3]
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from tests.runtime.image_inputs import Entry, layer_tar
from tests.runtime.oci_images import ImageSpec, write_layout
from tests.runtime.registry_server import SKOPEO, running_registry

ORCHARD = [sys.executable, "-m", "orchard.cli"]


def make_layer(n: int, size: int) -> bytes:
    rng = random.Random(n)
    text = b"".join(
        f"line {i} of layer {n}: the quick brown fox\n".encode() for i in range(size // 80)
    )
    return layer_tar([Entry(f"l{n}", "dir", mode=0o755),
                      Entry(f"l{n}/random.bin", data=rng.randbytes(size // 2)),
                      Entry(f"l{n}/text.txt", data=text[: size // 2])])  # fmt: skip


def timed(cmd: list[str]) -> tuple[float, str]:
    started = time.monotonic()
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    seconds = time.monotonic() - started
    if done.returncode != 0:
        raise SystemExit(f"{cmd[:4]} failed: {done.stderr[-2000:]}")
    return seconds, done.stdout


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--layer-mb", type=int, default=12)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--parallel", type=int, default=4)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-pull-", dir="/var/tmp"))
    try:
        layers = [make_layer(n, args.layer_mb << 20) for n in range(args.layers)]
        layout = write_layout(work / "layout", "1", [ImageSpec(layers)])
        compressed = sum(len(gzip.compress(layer, 1)) for layer in layers)
        results: dict[str, list[float]] = {"orchard_pull": [], "skopeo_copy_dir": [],
                                           "orchard_pull_cached": [], "orchard_in_process": [],
                                           "orchard_download_phase": [], "orchard_cli_startup": [],
                                           "orchard_cached_in_process": []}  # fmt: skip
        with running_registry(work / "registry") as registry:
            registry.push(layout, "1", "bench/image")
            ref = f"{registry.host}/bench/image:1"
            env_clean = {
                k: v for k, v in os.environ.items() if not k.startswith("ORCHARD_REGISTRY")
            }
            os.environ.clear()
            os.environ.update(env_clean)
            for r in range(args.rounds):
                images = work / f"images-{r}"
                seconds, out = timed([*ORCHARD, "image", "pull", ref, "--plain-http", "--json",
                                      "--parallel", str(args.parallel), "--images-dir", str(images)])  # fmt: skip
                results["orchard_pull"].append(seconds)
                done = [json.loads(line) for line in out.splitlines()][-1]
                results["orchard_in_process"].append(done["seconds"])
                results["orchard_download_phase"].append(done["extra"]["download_wall_seconds"])
                target = work / f"skopeo-{r}"
                seconds, _ = timed([SKOPEO, "copy", "--quiet", "--src-tls-verify=false",
                                    f"docker://{ref}", f"dir:{target}"])  # fmt: skip
                results["skopeo_copy_dir"].append(seconds)
                seconds, out = timed([*ORCHARD, "image", "pull", ref, "--plain-http", "--json",
                                      "--name", "again:1", "--images-dir", str(images)])  # fmt: skip
                results["orchard_pull_cached"].append(seconds)
                done = [json.loads(line) for line in out.splitlines()][-1]
                results["orchard_cached_in_process"].append(done["seconds"])
                seconds, _ = timed([*ORCHARD, "image", "pull", "--help"])
                results["orchard_cli_startup"].append(seconds)
                shutil.rmtree(images)
                shutil.rmtree(target)
        report: dict[str, Any] = {
            "layers": args.layers,
            "uncompressed_mb": round(sum(map(len, layers)) / 1e6, 1),
            "compressed_mb": round(compressed / 1e6, 1),
            "rounds": args.rounds,
            "parallel": args.parallel,
            "load_average": round(os.getloadavg()[0], 2),
            "cpus": os.cpu_count(),
        }
        for key, values in results.items():
            report[f"{key}_s_p50"] = round(statistics.median(values), 3)
            report[f"{key}_s_all"] = [round(v, 3) for v in values]
        print(json.dumps(report, indent=2))
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
