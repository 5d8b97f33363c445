"""Image references (``[host[:port]/]path[:tag][@digest]``) and the local name of a pulled image.

The grammar is the distribution spec's (and Docker's): the first component is a
registry host when it has a ``.`` or ``:`` or is ``localhost``; otherwise the
reference is on Docker Hub, whose one-component names live under ``library/``
and whose API host is ``registry-1.docker.io``. A tag defaults to ``latest``
when the reference has no digest.

Orchard image names have no ``/`` (``layout.IMAGE_NAME_RE``: they become one
folder of the store), so a pulled image is stored under the reference's last
path component and its tag: ``swebench/sweb.eval.x86_64.django__django-11099:latest``
becomes ``sweb.eval.x86_64.django__django-11099:latest``. A pull can name it
otherwise (``--name``); ``recipes/swe/images.py`` applies the same rule.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from orchard.common.layout import IMAGE_NAME_RE

DOCKER_HUB = "docker.io"
DOCKER_HUB_API = "registry-1.docker.io"
_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
PATH_RE = re.compile(rf"^{_COMPONENT}(?:/{_COMPONENT})*$")
TAG_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$")
DIGEST_RE = re.compile(r"^(sha256):([0-9a-f]{64})$|^(sha512):([0-9a-f]{128})$")
HOST_RE = re.compile(
    r"^(?:[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?\.?)+(?::[0-9]{1,5})?$|^\[[0-9a-fA-F:]+\](?::[0-9]{1,5})?$"
)


class ReferenceError(ValueError):
    """A malformed image reference (the message names it)."""


@dataclass(frozen=True)
class ImageRef:
    registry: str
    """Registry host (``docker.io`` for Docker Hub), with its port if any."""
    repository: str
    """Repository path on that registry (``library/python``)."""
    tag: str = "latest"
    digest: str = ""
    """``sha256:<hex>`` when the reference pins one (then the tag is informational)."""

    @property
    def api_host(self) -> str:
        return DOCKER_HUB_API if self.registry == DOCKER_HUB else self.registry

    @property
    def reference(self) -> str:
        """What ``/v2/<name>/manifests/<reference>`` is asked for: the digest, else the tag."""
        return self.digest or self.tag

    def __str__(self) -> str:
        text = f"{self.registry}/{self.repository}:{self.tag}"
        return f"{text}@{self.digest}" if self.digest else text


def parse_ref(text: str) -> ImageRef:
    """The reference ``text``; :class:`ReferenceError` says what is wrong with a bad one."""
    if not text or len(text) > 512 or text != text.strip():
        raise ReferenceError(f"invalid image reference {text!r}")
    rest, _, digest = text.partition("@")
    if digest and not DIGEST_RE.match(digest):
        raise ReferenceError(f"invalid digest in image reference {text!r}")
    first, slash, remainder = rest.partition("/")
    if slash and ("." in first or ":" in first or first == "localhost"):
        registry, path = first, remainder
        if not HOST_RE.match(registry):
            raise ReferenceError(f"invalid registry host {registry!r} in {text!r}")
    else:
        registry, path = DOCKER_HUB, rest
    path, colon, tag = path.partition(":")
    if colon and not TAG_RE.match(tag):
        raise ReferenceError(f"invalid tag {tag!r} in image reference {text!r}")
    if not PATH_RE.match(path):
        raise ReferenceError(f"invalid repository {path!r} in image reference {text!r}")
    if registry == DOCKER_HUB and "/" not in path:
        path = f"library/{path}"
    return ImageRef(registry, path, tag or "latest", digest)


def local_name(ref: ImageRef) -> str:
    """The Orchard image name a pull stores ``ref`` under (module docstring)."""
    name = f"{ref.repository.rpartition('/')[2]}:{ref.tag}"
    if IMAGE_NAME_RE.fullmatch(name) is None:
        raise ReferenceError(f"{ref} has no valid local name ({name!r}); name it with --name")
    return name
