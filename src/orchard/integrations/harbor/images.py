"""Which Orchard image stands in for a Harbor task's environment, and what of it we can honour.

A Harbor task names its environment either as a prebuilt image (``docker_image`` in
``task.toml``) or as ``environment/Dockerfile``. Orchard runs existing images (the
default ``debian:bookworm``, imported ``docker save``/OCI tarballs); it builds nothing.
So a Dockerfile is read, never built: its ``FROM`` names the base image, and only
instructions that change no file of the image are honoured (``WORKDIR``, ``ENV``,
``USER``, and the metadata-only ``LABEL``/``MAINTAINER``/``EXPOSE``). Any other
instruction (``RUN``, ``COPY``, ``ADD``, a second ``FROM`` ...) would need a build, and
is refused with the instruction named, never skipped. A ``docker-compose.yaml`` is
refused the same way (Orchard has no multi-container environments).

The image reference is then mapped: ``images`` (the environment's keyword argument)
maps a task's reference to an Orchard image name, ``"*"`` mapping any reference that is
not listed; an unmapped reference is used as the Orchard image name as it is (Orchard's
images are named like Docker's, e.g. ``debian:bookworm``).

This module imports nothing of Harbor, so it is tested on any Python.
"""

from __future__ import annotations

import posixpath
import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

DOCKERFILE = "Dockerfile"
COMPOSE_FILE = "docker-compose.yaml"
FALLBACK_KEY = "*"

_METADATA_ONLY = frozenset({"LABEL", "MAINTAINER", "EXPOSE"})


class UnsupportedEnvironmentError(ValueError):
    """The task's environment needs something Orchard cannot do (a build, compose)."""


@dataclass(frozen=True)
class ImageStandIn:
    """What a sandbox must start from to stand in for the task's environment."""

    reference: str
    """The image the task names (``docker_image`` or the Dockerfile's ``FROM``)."""
    workdir: str | None = None
    env: Mapping[str, str] = field(default_factory=dict)
    user: str | None = None


def stand_in(environment_dir: Path, docker_image: str | None) -> ImageStandIn:
    """The task's environment as an image reference plus what we honour of its Dockerfile."""
    if (environment_dir / COMPOSE_FILE).exists():
        raise UnsupportedEnvironmentError(
            f"{environment_dir / COMPOSE_FILE}: Orchard runs one container per sandbox; "
            "Docker Compose environments are not supported"
        )
    dockerfile = environment_dir / DOCKERFILE
    if docker_image:
        # Harbor uses the prebuilt image and ignores the Dockerfile unless a build is forced.
        return ImageStandIn(docker_image)
    if not dockerfile.exists():
        raise UnsupportedEnvironmentError(
            f"{environment_dir}: the task names neither docker_image nor a Dockerfile"
        )
    return parse_dockerfile(dockerfile.read_text(), str(dockerfile))


def parse_dockerfile(text: str, where: str = DOCKERFILE) -> ImageStandIn:
    """Read a Dockerfile that needs no build; raise for any instruction that does."""
    reference: str | None = None
    workdir: str | None = None
    env: dict[str, str] = {}
    user: str | None = None
    for number, instruction, argument in _instructions(text):
        at = f"{where}:{number}"
        if instruction == "FROM":
            if reference is not None:
                raise UnsupportedEnvironmentError(f"{at}: multi-stage builds need a build")
            words = argument.split()
            if not words or words[0].startswith("--") or len(words) not in (1, 3):
                raise UnsupportedEnvironmentError(f"{at}: unsupported FROM {argument!r}")
            reference = words[0]
        elif reference is None:
            raise UnsupportedEnvironmentError(f"{at}: {instruction} before FROM needs a build")
        elif instruction == "WORKDIR":
            workdir = posixpath.normpath(posixpath.join(workdir or "/", argument.strip()))
        elif instruction == "ENV":
            env.update(_env_pairs(argument, at))
        elif instruction == "USER":
            user = argument.strip()
        elif instruction not in _METADATA_ONLY:
            raise UnsupportedEnvironmentError(
                f"{at}: {instruction} changes the image and Orchard does not build images; "
                "import an image that already has it (orchard image import) and name it "
                "in task.toml's docker_image or in the environment's images mapping"
            )
    if reference is None:
        raise UnsupportedEnvironmentError(f"{where}: no FROM instruction")
    return ImageStandIn(reference, workdir, env, user)


def orchard_image(reference: str, images: Mapping[str, str]) -> str:
    """The Orchard image for a task's image reference."""
    return images.get(reference) or images.get(FALLBACK_KEY) or reference


def _instructions(text: str) -> list[tuple[int, str, str]]:
    """(line number, INSTRUCTION, argument) with comments dropped and continuations joined."""
    result: list[tuple[int, str, str]] = []
    pending = ""
    start = 0
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if not pending:
            start = number
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        whole = (pending + line).strip()
        pending = ""
        instruction, _, argument = whole.partition(" ")
        result.append((start, instruction.upper(), argument.strip()))
    if pending:
        raise UnsupportedEnvironmentError(
            f"line {start}: the Dockerfile ends inside a continuation"
        )
    return result


def _env_pairs(argument: str, at: str) -> dict[str, str]:
    try:
        words = shlex.split(argument)
    except ValueError as exc:
        raise UnsupportedEnvironmentError(f"{at}: ENV {argument!r}: {exc}") from None
    if words and "=" not in words[0]:
        # The legacy form: ENV KEY value with spaces
        key, _, value = argument.partition(" ")
        return {key: value.strip()}
    pairs: dict[str, str] = {}
    for word in words:
        key, sep, value = word.partition("=")
        if not sep or not key:
            raise UnsupportedEnvironmentError(f"{at}: ENV {argument!r} is not KEY=value")
        if "$" in value:
            raise UnsupportedEnvironmentError(
                f"{at}: ENV {key} uses a variable; expansion needs a build"
            )
        pairs[key] = value
    return pairs
