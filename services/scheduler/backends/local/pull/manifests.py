"""Manifests, indexes and image configs: media types, platform selection, parsing.

Supported: OCI image indexes and Docker manifest lists (a platform is picked),
OCI image manifests and Docker v2 schema 2 manifests. Docker's schema 1
(signed, deprecated since 2017) and anything else are refused by media type.
Every document is hostile: a field of the wrong type is an INVALID_MANIFEST
error naming the field, never a ``KeyError``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from .errors import INVALID_MANIFEST, PLATFORM_NOT_FOUND, UNSUPPORTED_MEDIA_TYPE, PullError
from .ref import DIGEST_RE

OCI_INDEX = "application/vnd.oci.image.index.v1+json"
DOCKER_LIST = "application/vnd.docker.distribution.manifest.list.v2+json"
OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
DOCKER_MANIFEST = "application/vnd.docker.distribution.manifest.v2+json"
INDEX_TYPES = (OCI_INDEX, DOCKER_LIST)
MANIFEST_TYPES = (OCI_MANIFEST, DOCKER_MANIFEST)
ACCEPT = ", ".join((*INDEX_TYPES, *MANIFEST_TYPES))
CONFIG_TYPES = (
    "application/vnd.oci.image.config.v1+json",
    "application/vnd.docker.container.image.v1+json",
)
LAYER_TYPES = (
    "application/vnd.oci.image.layer.v1.tar",
    "application/vnd.oci.image.layer.v1.tar+gzip",
    "application/vnd.oci.image.layer.v1.tar+zstd",
    "application/vnd.docker.image.rootfs.diff.tar.gzip",
    "application/vnd.docker.image.rootfs.diff.tar",
)
MAX_MANIFEST_BYTES = 4 << 20
"""The distribution spec lets registries refuse manifests over 4 MiB; so do we."""
MAX_CONFIG_BYTES = 16 << 20
DEFAULT_PLATFORM = "linux/amd64"


@dataclass(frozen=True)
class Descriptor:
    media_type: str
    digest: str
    size: int
    platform: str = ""
    """``os/arch[/variant]`` of an index entry (empty elsewhere)."""


@dataclass(frozen=True)
class Manifest:
    media_type: str
    config: Descriptor
    layers: list[Descriptor]


@dataclass(frozen=True)
class ImageConfig:
    env: dict[str, str] = field(default_factory=dict)
    working_dir: str = "/"
    user: str = ""
    cmd: list[str] = field(default_factory=list)
    entrypoint: list[str] = field(default_factory=list)
    platform: str = ""
    diff_ids: list[str] = field(default_factory=list)
    """``rootfs.diff_ids``: the digests of the uncompressed layers, lowest first."""


def _load(data: bytes, what: str) -> dict[str, Any]:
    try:
        doc = json.loads(data)
    except ValueError as err:
        raise PullError(INVALID_MANIFEST, f"{what} is not JSON: {err}") from None
    if not isinstance(doc, dict):
        raise PullError(INVALID_MANIFEST, f"{what} is not a JSON object")
    return doc


def media_type_of(data: bytes, header_type: str, what: str) -> str:
    """The document's type: its own ``mediaType`` field, else the response's Content-Type."""
    doc = _load(data, what)
    own = doc.get("mediaType")
    declared = own if isinstance(own, str) and own else header_type.split(";")[0].strip()
    if declared not in (*INDEX_TYPES, *MANIFEST_TYPES):
        if doc.get("schemaVersion") == 1:
            declared = declared or "application/vnd.docker.distribution.manifest.v1+json"
        raise PullError(
            UNSUPPORTED_MEDIA_TYPE,
            f"{what} has media type {declared or '(none)'!r}; supported: {ACCEPT}",
        )
    return declared


def _descriptor(item: Any, what: str) -> Descriptor:
    if not isinstance(item, dict):
        raise PullError(INVALID_MANIFEST, f"{what} is not an object")
    media_type, digest, size = item.get("mediaType"), item.get("digest"), item.get("size")
    if not isinstance(media_type, str):
        raise PullError(INVALID_MANIFEST, f"{what}: mediaType is missing")
    if not isinstance(digest, str) or not DIGEST_RE.match(digest):
        raise PullError(INVALID_MANIFEST, f"{what}: bad digest {digest!r}")
    if not isinstance(size, int) or isinstance(size, bool) or size < 0:
        raise PullError(INVALID_MANIFEST, f"{what} ({digest}): bad size {size!r}")
    plat = item.get("platform")
    text = ""
    if isinstance(plat, dict):
        parts = [str(plat.get("os", "")), str(plat.get("architecture", ""))]
        if plat.get("variant"):
            parts.append(str(plat["variant"]))
        text = "/".join(parts)
    return Descriptor(media_type, digest, size, text)


def normalize_platform(text: str) -> str:
    """``linux/amd64``, ``linux/arm64/v8``…: lower case, ``arm64`` without variant = ``v8``."""
    parts = text.strip().lower().split("/")
    if len(parts) not in (2, 3) or not all(parts):
        raise PullError(PLATFORM_NOT_FOUND, f"bad platform {text!r}: expected os/arch[/variant]")
    if parts[1] == "arm64" and len(parts) == 2:
        parts.append("v8")
    return "/".join(parts)


def pick_platform(data: bytes, platform: str, what: str) -> Descriptor:
    """The index entry for ``platform`` (``os/arch[/variant]``); the error lists those there."""
    doc = _load(data, what)
    items = doc.get("manifests")
    if not isinstance(items, list) or not items:
        raise PullError(INVALID_MANIFEST, f"{what} lists no manifests")
    entries = [_descriptor(item, f"{what} manifests[{i}]") for i, item in enumerate(items)]
    wanted = normalize_platform(platform)
    for entry in entries:
        if entry.platform and normalize_platform(entry.platform) == wanted:
            return entry
    # An arm variant asked without one ("linux/arm") matches the first of that arch.
    for entry in entries:
        if entry.platform and normalize_platform(entry.platform).startswith(wanted + "/"):
            return entry
    listed = ", ".join(sorted({e.platform for e in entries if e.platform})) or "none"
    raise PullError(
        PLATFORM_NOT_FOUND, f"{what} has no image for platform {platform} (it has: {listed})"
    )


def parse_manifest(data: bytes, media_type: str, what: str) -> Manifest:
    doc = _load(data, what)
    config = _descriptor(doc.get("config"), f"{what} config")
    raw_layers = doc.get("layers")
    if not isinstance(raw_layers, list):
        raise PullError(INVALID_MANIFEST, f"{what} has no layers list")
    layers = [_descriptor(item, f"{what} layers[{i}]") for i, item in enumerate(raw_layers)]
    if config.media_type not in CONFIG_TYPES:
        raise PullError(
            UNSUPPORTED_MEDIA_TYPE,
            f"{what}: config {config.digest} has media type {config.media_type!r} "
            "(not an image: an artifact?)",
        )
    for i, layer in enumerate(layers):
        if layer.media_type not in LAYER_TYPES:
            raise PullError(
                UNSUPPORTED_MEDIA_TYPE,
                f"{what}: layer {i} ({layer.digest}) has media type {layer.media_type!r}; "
                f"supported: {', '.join(LAYER_TYPES)}",
            )
    return Manifest(media_type, config, layers)


def _strings(value: Any, what: str) -> list[str]:
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise PullError(INVALID_MANIFEST, f"image config {what} is not a list of strings")
    return list(value)


def parse_config(data: bytes, what: str) -> ImageConfig:
    doc = _load(data, what)
    inner = doc.get("config") or {}
    if not isinstance(inner, dict):
        raise PullError(INVALID_MANIFEST, f"{what}: 'config' is not an object")
    env: dict[str, str] = {}
    for item in _strings(inner.get("Env"), "Env"):
        key, sep, value = item.partition("=")
        if sep and key:
            env[key] = value
    cwd = inner.get("WorkingDir") or "/"
    user = inner.get("User") or ""
    if not isinstance(cwd, str) or not isinstance(user, str):
        raise PullError(INVALID_MANIFEST, f"{what}: WorkingDir or User is not a string")
    rootfs = doc.get("rootfs") or {}
    if not isinstance(rootfs, dict):
        raise PullError(INVALID_MANIFEST, f"{what}: 'rootfs' is not an object")
    diff_ids = _strings(rootfs.get("diff_ids"), "rootfs.diff_ids")
    for diff_id in diff_ids:
        if not DIGEST_RE.match(diff_id):
            raise PullError(INVALID_MANIFEST, f"{what}: bad diff_id {diff_id!r}")
    return ImageConfig(
        diff_ids=diff_ids,
        env=env,
        working_dir=cwd if cwd.startswith("/") else "/",
        user=user,
        cmd=_strings(inner.get("Cmd"), "Cmd"),
        entrypoint=_strings(inner.get("Entrypoint"), "Entrypoint"),
        platform=f"{doc.get('os', '')}/{doc.get('architecture', '')}",
    )
