"""OCI image layouts built in the tests (tar layers made with tarfile), for skopeo to push.

:func:`write_layout` writes ``oci-layout``, ``index.json`` and ``blobs/``: one image
manifest per platform, and, for more than one platform, an image index blob that
``index.json`` points at under the tag (``skopeo copy --all`` pushes it as a
multi-platform index).
"""

from __future__ import annotations

import gzip
import hashlib
import json
import random
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .image_inputs import Entry, layer_tar

LAYER_GZIP = "application/vnd.oci.image.layer.v1.tar+gzip"
LAYER_TAR = "application/vnd.oci.image.layer.v1.tar"
LAYER_ZSTD = "application/vnd.oci.image.layer.v1.tar+zstd"
MANIFEST = "application/vnd.oci.image.manifest.v1+json"
INDEX = "application/vnd.oci.image.index.v1+json"
CONFIG = "application/vnd.oci.image.config.v1+json"


@dataclass
class ImageSpec:
    layers: list[bytes]
    """Uncompressed layer tars, lowest first."""
    platform: str = "linux/amd64"
    env: list[str] = field(default_factory=lambda: ["PATH=/bin:/usr/bin", "GREETING=hi"])
    working_dir: str = "/data"
    user: str = "1000:1000"
    cmd: list[str] = field(default_factory=lambda: ["/bin/sh"])
    gzip_layers: bool = True
    zstd_layers: bool = False
    """Compress the layers with Debian's zstd program instead (``+zstd`` media type)."""
    diff_ids: list[str] | None = None
    """The config's ``rootfs.diff_ids`` (default: the true digests of the layers)."""


def random_file_layer(name: str, size: int, seed: int) -> bytes:
    """A layer with one file ``big/<name>`` of ``size`` incompressible bytes."""
    data = random.Random(seed).randbytes(size)
    return layer_tar([Entry("big", "dir", mode=0o755), Entry(f"big/{name}", data=data)])


class _Blobs:
    def __init__(self, root: Path) -> None:
        self.dir = root / "blobs" / "sha256"
        self.dir.mkdir(parents=True, exist_ok=True)

    def put(self, data: bytes, media_type: str) -> dict[str, Any]:
        digest = hashlib.sha256(data).hexdigest()
        (self.dir / digest).write_bytes(data)
        return {"mediaType": media_type, "digest": f"sha256:{digest}", "size": len(data)}


def _manifest(blobs: _Blobs, spec: ImageSpec) -> dict[str, Any]:
    os_name, arch, *variant = spec.platform.split("/")
    layer_descs, diff_ids = [], []
    for layer in spec.layers:
        diff_ids.append("sha256:" + hashlib.sha256(layer).hexdigest())
        if spec.zstd_layers:
            packed = subprocess.run(
                ["zstd", "-q", "-c"], input=layer, capture_output=True, check=True
            )
            layer_descs.append(blobs.put(packed.stdout, LAYER_ZSTD))
        elif spec.gzip_layers:
            layer_descs.append(blobs.put(gzip.compress(layer, compresslevel=1), LAYER_GZIP))
        else:
            layer_descs.append(blobs.put(layer, LAYER_TAR))
    config: dict[str, Any] = {
        "architecture": arch,
        "os": os_name,
        "config": {
            "Env": spec.env,
            "WorkingDir": spec.working_dir,
            "User": spec.user,
            "Cmd": spec.cmd,
        },
        "rootfs": {
            "type": "layers",
            "diff_ids": diff_ids if spec.diff_ids is None else spec.diff_ids,
        },
    }
    if variant:
        config["variant"] = variant[0]
    manifest = {
        "schemaVersion": 2,
        "mediaType": MANIFEST,
        "config": blobs.put(json.dumps(config).encode(), CONFIG),
        "layers": layer_descs,
    }
    desc = blobs.put(json.dumps(manifest).encode(), MANIFEST)
    desc["platform"] = {
        "os": os_name,
        "architecture": arch,
        **({"variant": variant[0]} if variant else {}),
    }
    return desc


def write_layout(root: Path, tag: str, images: list[ImageSpec]) -> Path:
    """An OCI layout at ``root`` with ``images`` under ``tag`` (an index when more than one)."""
    blobs = _Blobs(root)
    descs = [_manifest(blobs, spec) for spec in images]
    if len(descs) == 1:
        top = {k: v for k, v in descs[0].items() if k != "platform"}
    else:
        index = {"schemaVersion": 2, "mediaType": INDEX, "manifests": descs}
        top = blobs.put(json.dumps(index).encode(), INDEX)
    top["annotations"] = {"org.opencontainers.image.ref.name": tag}
    (root / "index.json").write_text(json.dumps({"schemaVersion": 2, "manifests": [top]}))
    (root / "oci-layout").write_text(json.dumps({"imageLayoutVersion": "1.0.0"}))
    return root
