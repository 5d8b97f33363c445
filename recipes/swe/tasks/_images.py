"""Each dataset's image naming, where a row does not name its image itself.

- SWE-bench (and Lite / Verified): ``swebench/sweb.eval.x86_64.<instance_id>:latest`` with
  ``__`` replaced by ``_1776_`` (Docker Hub refuses double underscores), lower-cased: the
  ``swebench`` package's ``ImageSpec.name`` for a remote image.
- SWE-Gym: ``xingyaoww/sweb.eval.x86_64.<instance_id>:latest`` with ``__`` replaced by ``_s_``
  (the image set SWE-Gym published with OpenHands).
- SWE-rebench v1: the row's ``docker_image`` / ``image_name``; otherwise the SWE-bench scheme
  under the ``swerebench`` namespace.
- SWE-rebench V2 and Scale-SWE rows always name theirs (``image_name``, ``image_url``).
"""

from __future__ import annotations

import re

# A Docker reference: [registry[:port]/]path[:tag][@digest], lower-case path components.
_REFERENCE = re.compile(
    r"^(?:[a-zA-Z0-9.-]+(?::[0-9]+)?/)?[a-z0-9]+(?:[._-]+[a-z0-9]+)*"
    r"(?:/[a-z0-9]+(?:[._-]+[a-z0-9]+)*)*(?::[\w][\w.-]{0,127})?(?:@sha256:[0-9a-f]{64})?$"
)


def swebench_image(instance_id: str, namespace: str = "swebench") -> str:
    return f"{namespace}/sweb.eval.x86_64.{instance_id}:latest".replace("__", "_1776_").lower()


def swe_gym_image(instance_id: str) -> str:
    return f"xingyaoww/sweb.eval.x86_64.{instance_id}:latest".replace("__", "_s_").lower()


def check_reference(image: str) -> str | None:
    """Why ``image`` is not a valid image reference, or None."""
    if len(image) > 512:
        return "longer than 512 characters"
    if not _REFERENCE.match(image):
        return f"{image!r} is not an image reference ([registry/]name[:tag][@sha256:digest])"
    return None
