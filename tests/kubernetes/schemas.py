"""Validation against the official Kubernetes OpenAPI schemas (kubernetes-validate ships them; no network)."""

from __future__ import annotations

from typing import Any

import kubernetes_validate

# The oldest and newest minor versions the chart supports.
KUBERNETES_VERSIONS = ("1.30", "1.33")


def schema_errors(manifest: dict[str, Any], version: str) -> list[str]:
    """Short error lines (strict: unknown fields are errors too); [] when valid."""
    try:
        kubernetes_validate.validate(manifest, version, strict=True)
    except kubernetes_validate.ValidationError as exc:
        path = "/".join(str(p) for p in exc.path)
        return [
            f"{manifest.get('kind')} {manifest.get('metadata', {}).get('name')}: {path}: {exc.message}"
        ]
    return []
