"""``orchard image ls | import | build-default | pull``.

``ls`` asks the control plane. ``import``, ``build-default`` and ``pull`` are node
admin commands: they call the local runtime's image store directly on this machine
(``ORCHARD_IMAGES_DIR`` or ``<ORCHARD_HOME>/images``), no server needed; the
scheduler sees a new image at its next listing (docs/images.md).
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
    _register_pull(sub)


def _register_pull(sub: Any) -> None:
    p = sub.add_parser(
        "pull", help="pull an image from an OCI / Docker registry (on this node, resumable)"
    )
    p.add_argument(
        "ref",
        metavar="REF",
        help="an image reference: host:port/repository:tag, "
        "a digest after @, Docker Hub without a host",
    )
    p.add_argument("--name", default=None, help="the image's name in Orchard (default: "
                   "the reference's last path component and tag)")  # fmt: skip
    p.add_argument("--platform", default="linux/amd64", help="os/arch[/variant] picked "
                   "from a multi-platform index (default linux/amd64)")  # fmt: skip
    p.add_argument("--auth-file", type=Path, default=None, help="credentials in the "
                   "docker/podman login format (default $ORCHARD_REGISTRY_AUTH_FILE)")  # fmt: skip
    p.add_argument(
        "--plain-http",
        action="store_true",
        help="talk HTTP, not HTTPS, to the registry (a loopback test registry)",
    )
    p.add_argument(
        "--ca-file",
        type=Path,
        default=None,
        help="CA (PEM) the registry's certificate is checked against",
    )
    p.add_argument("--parallel", type=int, default=4, help="layers downloaded at once")
    p.add_argument("--images-dir", type=Path, default=None, help=IMAGES_DIR_HELP)
    p.add_argument(
        "--json", action="store_true", help="progress as JSON Lines (one object per event)"
    )
    p.set_defaults(run=cmd_pull)


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


def cmd_pull(args: argparse.Namespace) -> int:
    import asyncio
    import sys

    from orchard.scheduler.backends.base import BackendError
    from orchard.scheduler.backends.local.pull.progress import printer_for
    from orchard.scheduler.backends.local.pull.pull import pull_image

    if not 1 <= args.parallel <= 64:
        raise InvalidRequestError("--parallel must be between 1 and 64")
    progress = printer_for(sys.stdout if args.json else sys.stderr, as_json=args.json)
    try:
        image = asyncio.run(
            pull_image(
                images_dir(args.images_dir),
                args.ref,
                name=args.name,
                platform=args.platform,
                auth_file=args.auth_file,
                plain_http=args.plain_http,
                ca_file=args.ca_file,
                parallel=args.parallel,
                progress=progress,
            )
        )
    except BackendError as exc:
        raise _backend_error(exc) from None
    if not args.json:
        print(image.name)
    return 0
