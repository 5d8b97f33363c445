"""Small real image archives for the import tests, built with tarfile (no Docker needed).

Two layers over a tiny rootfs: layer 2 deletes a file of layer 1 with a
``.wh.`` whiteout and replaces a folder's contents with an opaque marker.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import tarfile
from dataclasses import dataclass
from pathlib import Path

CONFIG = {
    "architecture": "amd64",
    "os": "linux",
    "config": {"Env": ["PATH=/bin", "GREETING=hi"], "WorkingDir": "/data"},
    "rootfs": {"type": "layers", "diff_ids": []},
}


@dataclass(frozen=True)
class Entry:
    name: str
    kind: str = "file"  # file, dir, symlink, hardlink
    data: bytes = b""
    target: str = ""
    mode: int = 0o644
    uid: int = 0


LAYER_1 = [
    Entry("etc", "dir", mode=0o755),
    Entry("etc/hello", data=b"hello\n"),
    Entry("etc/keep", data=b"keep\n"),
    Entry("etc/hello-hardlink", "hardlink", target="etc/hello"),
    Entry("etc/absolute-link", "symlink", target="/etc/keep"),
    Entry("data", "dir", mode=0o755),
    Entry("data/a", data=b"a\n"),
    Entry("data/b", data=b"b\n", uid=1000),
    Entry("bin", "dir", mode=0o755),
    Entry("bin/tool", data=b"#!/bin/sh\necho tool\n", mode=0o755),
]
LAYER_2 = [
    Entry("etc", "dir", mode=0o755),
    Entry("etc/.wh.hello"),
    Entry("etc/new", data=b"new\n"),
    Entry("data", "dir", mode=0o755),
    Entry("data/.wh..wh..opq"),
    Entry("data/c", data=b"c\n"),
]


def layer_tar(entries: list[Entry]) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for entry in entries:
            info = tarfile.TarInfo(entry.name)
            info.mode = entry.mode
            info.uid = info.gid = entry.uid
            info.mtime = 1_700_000_000
            if entry.kind == "dir":
                info.type = tarfile.DIRTYPE
                tar.addfile(info)
            elif entry.kind == "symlink":
                info.type = tarfile.SYMTYPE
                info.linkname = entry.target
                tar.addfile(info)
            elif entry.kind == "hardlink":
                info.type = tarfile.LNKTYPE
                info.linkname = entry.target
                tar.addfile(info)
            else:
                info.size = len(entry.data)
                tar.addfile(info, io.BytesIO(entry.data))
    return out.getvalue()


def write_tar_of(files: dict[str, bytes], path: Path) -> Path:
    with tarfile.open(path, "w") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            info.mode = 0o644
            tar.addfile(info, io.BytesIO(data))
    return path


def docker_save_files(layers: list[bytes], repo_tag: str = "tiny:1") -> dict[str, bytes]:
    files = {"config.json": json.dumps(CONFIG).encode()}
    names = []
    for n, layer in enumerate(layers):
        names.append(f"layer{n}/layer.tar")
        files[names[-1]] = layer
    manifest = [{"Config": "config.json", "RepoTags": [repo_tag], "Layers": names}]
    files["manifest.json"] = json.dumps(manifest).encode()
    return files


def oci_layout_files(layers: list[bytes], *, gzip_layers: bool = True) -> dict[str, bytes]:
    files: dict[str, bytes] = {}

    def blob(data: bytes, media_type: str) -> dict[str, object]:
        digest = hashlib.sha256(data).hexdigest()
        files[f"blobs/sha256/{digest}"] = data
        return {"mediaType": media_type, "digest": f"sha256:{digest}", "size": len(data)}

    layer_descs = []
    for layer in layers:
        if gzip_layers:
            layer_descs.append(
                blob(gzip.compress(layer), "application/vnd.oci.image.layer.v1.tar+gzip")
            )
        else:
            layer_descs.append(blob(layer, "application/vnd.oci.image.layer.v1.tar"))
    config = blob(json.dumps(CONFIG).encode(), "application/vnd.oci.image.config.v1+json")
    manifest = {
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": config,
        "layers": layer_descs,
    }
    manifest_desc = blob(
        json.dumps(manifest).encode(), "application/vnd.oci.image.manifest.v1+json"
    )
    manifest_desc["annotations"] = {"org.opencontainers.image.ref.name": "1"}
    files["index.json"] = json.dumps({"schemaVersion": 2, "manifests": [manifest_desc]}).encode()
    files["oci-layout"] = json.dumps({"imageLayoutVersion": "1.0.0"}).encode()
    return files


def write_dir_of(files: dict[str, bytes], root: Path) -> Path:
    for name, data in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    return root
