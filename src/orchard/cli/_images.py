"""``orchard image ls | import | build-default``.

``ls`` asks the control plane. ``import`` and ``build-default`` are node admin
commands: they call the local runtime's image store directly on this machine
(``ORCHARD_IMAGES_DIR`` or ``<ORCHARD_HOME>/images``), no server needed.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

from orchard.client import InvalidRequestError, OrchardError
from orchard.common.layout import orchard_home

from ._connect import client
from ._json import add_flag, print_lines
from ._sandboxes import print_table

IMAGES_DIR_HELP = "images folder (default $ORCHARD_IMAGES_DIR or <home>/images)"


def register(commands: Any) -> None:
    image = commands.add_parser("image", help="images")
    sub = image.add_subparsers(dest="image_command", required=True, metavar="SUBCOMMAND")
    p = sub.add_parser("ls", help="list images (via the server)")
    add_flag(p)
    p.set_defaults(run=cmd_ls)
    p = sub.add_parser(
        "import",
        help="import a docker-save / OCI tarball, a rootfs tarball (docker export; "
        "gz/bz2/xz/zst) or a rootfs directory (on this node)",
    )
    p.add_argument("source", metavar="SOURCE", help="a docker-save or OCI tarball, or a folder")
    p.add_argument("--name", required=True, help="the image's name in Orchard")
    p.add_argument("--images-dir", type=Path, default=None, help=IMAGES_DIR_HELP)
    p.set_defaults(run=cmd_import)
    p = sub.add_parser(
        "build-default", help="build the default Debian image (on this node, cached)"
    )
    p.add_argument("--images-dir", type=Path, default=None, help=IMAGES_DIR_HELP)
    p.set_defaults(run=cmd_build_default)


def images_dir(explicit: Path | None) -> Path:
    if explicit is not None:
        return explicit
    env = os.environ.get("ORCHARD_IMAGES_DIR")
    return Path(env) if env else orchard_home() / "images"


def cmd_ls(args: argparse.Namespace) -> int:
    images = client(args).images.list()
    if args.json:
        print_lines(images)
        return 0
    rows = [
        [i.name, "yes" if i.is_default else "", str(i.layers), f"{i.size_bytes / 1e6:.0f} MB"]
        for i in images
    ]
    print_table(["NAME", "DEFAULT", "LAYERS", "SIZE"], rows)
    return 0


def _backend_error(exc: Exception) -> OrchardError:
    return OrchardError(str(getattr(exc, "message", exc)), reason=str(getattr(exc, "reason", "")))


def cmd_import(args: argparse.Namespace) -> int:
    from orchard.scheduler.backends.base import BackendError
    from orchard.scheduler.backends.local import images as local_images

    import_image = getattr(local_images, "import_image", None)
    if import_image is None:
        raise InvalidRequestError(
            "image import is not available in this build of the local runtime yet"
        )
    source = Path(args.source)
    if not source.exists():
        raise InvalidRequestError(f"image import: {source}: no such file or directory")
    try:
        image = import_image(images_dir(args.images_dir), source, args.name)
    except BackendError as exc:
        raise _backend_error(exc) from None
    print(image.name)
    return 0


def cmd_build_default(args: argparse.Namespace) -> int:
    from orchard.scheduler.backends.base import BackendError
    from orchard.scheduler.backends.local.images import build_default_image

    try:
        image = build_default_image(images_dir(args.images_dir))
    except BackendError as exc:
        raise _backend_error(exc) from None
    print(f"{image.name}: {image.folder}")
    return 0
