"""The images a dataset's rollouts need: checked present before the first rollout (or pulled).

A SWE dataset names one registry image per task (``swebench/sweb.eval.x86_64.<id>:latest``,
``xingyaoww/sweb.eval.x86_64.<id>``, ...). Orchard stores a pulled image under the
reference's last path component and its tag (``orchard image pull``, docs/images.md):
:func:`local_image_name` is that rule, so the recipe creates sandboxes by those names.

:func:`ensure_images` asks the control plane which images exist (the public SDK's
``client.images.list()``) and, for the missing ones, either fails with one error naming
every one of them, or (``pull=True``) runs ``orchard image pull`` for each and asks
again. Pulling is a node admin command today (it writes the node's images folder; there
is no pull RPC through the gateway yet), so ``pull=True`` works where the recipe runs on
the node that serves the sandboxes; elsewhere pull the images on the node first.
"""

from __future__ import annotations

import re
import subprocess
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import orchard

_TAG_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$")
_NAME_RE = re.compile(r"^[a-z0-9][a-z0-9._-]{0,127}(:[A-Za-z0-9._-]{1,128})?$")


class MissingImagesError(orchard.OrchardError):
    """Images the dataset needs that the service does not have (:attr:`missing`: ref -> why)."""

    def __init__(self, missing: dict[str, str]) -> None:
        lines = "\n".join(f"  {ref}: {why}" for ref, why in missing.items())
        super().__init__(
            f"{len(missing)} image(s) the dataset needs are missing:\n{lines}",
            reason="IMAGE_NOT_FOUND",
        )
        self.missing = missing


def local_image_name(ref: str) -> str:
    """The name ``orchard image pull REF`` stores ``ref`` under (the last path component
    and the tag, ``latest`` when there is none; a digest is not part of the name)."""
    without_digest = ref.partition("@")[0]
    last = without_digest.rpartition("/")[2]
    name, colon, tag = last.partition(":")
    if colon and not _TAG_RE.match(tag):
        raise ValueError(f"image reference {ref!r} has an invalid tag {tag!r}")
    local = f"{name}:{tag or 'latest'}"
    if not _NAME_RE.match(local):
        raise ValueError(f"image reference {ref!r} gives no valid Orchard image name ({local!r})")
    return local


@dataclass(frozen=True)
class ImagePlan:
    """The outcome of :func:`ensure_images`: ref -> local name, and which were pulled."""

    names: dict[str, str]
    pulled: list[str]


def _present(client: orchard.Orchard) -> set[str]:
    return {image.name for image in client.images.list()}


def ensure_images(
    refs: Iterable[str],
    client: orchard.Orchard,
    *,
    pull: bool = False,
    orchard_command: Sequence[str] = ("orchard",),
    pull_args: Sequence[str] = (),
    timeout: float = 3600.0,
) -> ImagePlan:
    """Check that every image in ``refs`` exists (pulling the missing ones when ``pull``);
    :class:`MissingImagesError` names every one still missing, with the pull's error."""
    names: dict[str, str] = {}
    invalid: dict[str, str] = {}
    for ref in dict.fromkeys(refs):
        try:
            names[ref] = local_image_name(ref)
        except ValueError as err:
            invalid[ref] = str(err)
    present = _present(client)
    missing = {ref: name for ref, name in names.items() if name not in present}
    why: dict[str, str] = dict(invalid)
    pulled: list[str] = []
    if pull and missing:
        for ref, name in missing.items():
            cmd = [*orchard_command, "image", "pull", ref, "--name", name, *pull_args]
            try:
                done = subprocess.run(
                    cmd, capture_output=True, text=True, timeout=timeout, check=False
                )
            except (OSError, subprocess.TimeoutExpired) as err:
                why[ref] = f"orchard image pull did not run: {err}"
                continue
            if done.returncode != 0:
                last = (done.stderr.strip().splitlines() or ["(no output)"])[-1]
                why[ref] = f"pull failed: {last}"
            else:
                pulled.append(ref)
        present = _present(client)
    for ref, name in missing.items():
        if name not in present and ref not in why:
            why[ref] = (
                f"no image {name!r} on the service"
                if not pull
                else f"pulled, but the service does not list {name!r} (another node's store?)"
            )
    if why:
        raise MissingImagesError(why)
    return ImagePlan(names, pulled)
