"""The browser image: Debian's Chromium, Playwright for Python and MiniWoB++'s HTML, built once.

Why an image and not a tools-layer-like mount: Chromium is a Debian package with ~80 shared
libraries (NSS, GTK's accessibility stack, fontconfig, ...) that live in ``/usr/lib`` and
expect ``/etc/fonts``; a layer mounted under ``/opt`` would need ``LD_LIBRARY_PATH`` and
font-config surgery and would still depend on the base image's libc matching. A whole image
built by ``mmdebstrap`` resolves those dependencies with apt, the way the default image is
built (``make image``), and sandboxes mount its layers read-only, so a hundred browser
sandboxes share one copy on disk.

What goes in (all cached, nothing fetched when a sandbox starts; browser sandboxes run with
network ``none``):

- ``mmdebstrap --variant=minbase`` of bookworm with ``bookworm-security`` (Debian ships
  Chromium's updates there), including :data:`PACKAGES`;
- Playwright for Python (PyPI wheel, pinned in :data:`PLAYWRIGHT`, with its pure
  dependencies) installed with ``pip --target`` into ``/opt/orchard-gui/python`` for the
  image's own Python 3.11; it drives ``/usr/bin/chromium`` via ``executable_path`` (its own
  browser download does not work offline, and is not needed);
- MiniWoB++'s ``html`` folder from the PyPI ``miniwob`` wheel (:data:`MINIWOB`) in
  ``/opt/orchard-gui/miniwob``.

The image is imported with the public ``orchard image import`` command (a rootfs folder), as
``gui-browser:<key>`` where the key is a hash of everything above: changing a pin builds a
new image instead of serving a stale one. ``python -m orchard.recipes.gui.image build``
(``make browser-image``) builds it; ``... name`` prints the name the recipe will use.

The in-sandbox server (``server.py`` beside this module) is NOT baked in: the driver uploads
it when a browser sandbox starts, so changing it needs no image rebuild.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

IMAGE_REPO = "gui-browser"
SUITE = "bookworm"
MIRRORS = (
    "deb http://deb.debian.org/debian bookworm main",
    "deb http://deb.debian.org/debian bookworm-updates main",
    "deb http://deb.debian.org/debian-security bookworm-security main",
)
PACKAGES = (
    "bash",
    "coreutils",
    "procps",
    "python3",
    "ca-certificates",
    "chromium",
    # Playwright's bundled Node.js links against it; minbase does not carry it.
    "libatomic1",
    # Chromium renders text with whatever fontconfig finds: without a font every glyph is a
    # box. DejaVu and Liberation cover MiniWoB's Arial/sans-serif text.
    "fonts-dejavu-core",
    "fonts-liberation",
)
PLAYWRIGHT = "playwright==1.65.2"
MINIWOB = "miniwob==1.1.0"
# Bumped when the build steps below change in a way the pins do not show.
BUILD_VERSION = "1"

GUI_ROOT = "/opt/orchard-gui"
PYTHONPATH_IN_IMAGE = f"{GUI_ROOT}/python"
MINIWOB_HTML_IN_IMAGE = f"{GUI_ROOT}/miniwob"
CHROMIUM_IN_IMAGE = "/usr/bin/chromium"


def image_key() -> str:
    """A hash of every input of the build (packages, mirrors, pins, build version)."""
    text = "\n".join(
        [BUILD_VERSION, SUITE, *MIRRORS, *PACKAGES, PLAYWRIGHT, MINIWOB, PYTHONPATH_IN_IMAGE]
    )
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def image_name() -> str:
    """The image name browser sandboxes are created from (``gui-browser:<key>``)."""
    return f"{IMAGE_REPO}:{image_key()}"


def images_dir() -> Path:
    """The node's image store (``$ORCHARD_IMAGES_DIR``, else ``$ORCHARD_HOME/images``)."""
    explicit = os.environ.get("ORCHARD_IMAGES_DIR")
    if explicit:
        return Path(explicit)
    return Path(os.environ.get("ORCHARD_HOME") or "/var/lib/orchard") / "images"


def is_built(store: Path | None = None) -> bool:
    """Whether the store holds :func:`image_name` (the store's documented folder layout:
    ``<name with ':' as '+'>/image.json``, docs/images.md)."""
    folder = (store or images_dir()) / image_name().replace(":", "+")
    return (folder / "image.json").is_file()


def _run(cmd: list[str], what: str) -> None:
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip()[-3000:]
        raise RuntimeError(f"{what} failed ({proc.returncode}): {tail}")


def _bootstrap(rootfs: Path) -> None:
    cmd = [
        "mmdebstrap",
        "--variant=minbase",
        f"--include={','.join(PACKAGES)}",
        "--quiet",
        SUITE,
        str(rootfs),
        *MIRRORS,
    ]
    _run(cmd, "mmdebstrap")
    for etc_file in ("etc/hostname", "etc/resolv.conf"):
        path = rootfs / etc_file
        if not path.exists() and not path.is_symlink():
            path.write_text("")


def _install_playwright(rootfs: Path) -> None:
    """Playwright's wheel and dependencies for CPython 3.11 on x86_64 (bookworm's python3),
    installed into the rootfs with pip's ``--target`` (never into the image's own Python)."""
    target = rootfs / PYTHONPATH_IN_IMAGE.lstrip("/")
    cmd = [
        sys.executable, "-m", "pip", "install", "--quiet", "--no-compile",
        "--target", str(target), "--python-version", "3.11", "--implementation", "cp",
        "--platform", "manylinux2014_x86_64", "--platform", "manylinux_2_17_x86_64",
        "--platform", "manylinux1_x86_64", "--only-binary=:all:", PLAYWRIGHT,
    ]  # fmt: skip
    _run(cmd, "pip install playwright")


def _install_miniwob_html(rootfs: Path, work: Path) -> None:
    _run(
        [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "-d", str(work), MINIWOB],
        "pip download miniwob",
    )
    wheels = sorted(work.glob("miniwob-*.whl"))
    if len(wheels) != 1:
        raise RuntimeError(f"expected one miniwob wheel in {work}, found {wheels}")
    target = rootfs / MINIWOB_HTML_IN_IMAGE.lstrip("/")
    prefix = "miniwob/html/"
    with zipfile.ZipFile(wheels[0]) as wheel:
        for info in wheel.infolist():
            if not info.filename.startswith(prefix) or info.is_dir():
                continue
            rel = Path(info.filename[len(prefix) :])
            if rel.is_absolute() or ".." in rel.parts:
                raise RuntimeError(f"miniwob wheel: unsafe path {info.filename!r}")
            dest = target / rel
            dest.parent.mkdir(parents=True, exist_ok=True)
            dest.write_bytes(wheel.read(info))
    if not (target / "miniwob" / "click-button.html").is_file():
        raise RuntimeError("miniwob wheel: no miniwob/click-button.html in its html folder")


def build(store: Path | None = None, *, orchard_cli: list[str] | None = None) -> str:
    """Build and import the browser image unless the store has it; returns its name."""
    store = store or images_dir()
    name = image_name()
    if is_built(store):
        return name
    store.mkdir(parents=True, exist_ok=True)
    # Beside the store (same filesystem: the import's copy is cheap); removed afterwards.
    work = Path(tempfile.mkdtemp(prefix=".gui-browser-build-", dir=store.parent))
    try:
        rootfs = work / "rootfs"
        _bootstrap(rootfs)
        _install_playwright(rootfs)
        _install_miniwob_html(rootfs, work)
        os.chmod(rootfs, 0o755)
        cli = orchard_cli or [sys.executable, "-m", "orchard.cli"]
        _run(
            [*cli, "image", "import", str(rootfs), "--name", name, "--images-dir", str(store)],
            "orchard image import",
        )
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return name


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m orchard.recipes.gui.image")
    sub = parser.add_subparsers(dest="command", required=True)
    b = sub.add_parser("build", help="build the browser image (cached by its inputs)")
    b.add_argument("--images-dir", type=Path, default=None)
    sub.add_parser("name", help="print the browser image's name")
    args = parser.parse_args(argv)
    if args.command == "name":
        print(image_name())
        return 0
    started = time.monotonic()
    store = args.images_dir or images_dir()
    cached = is_built(store)
    name = build(store)
    how = "cached" if cached else f"built in {time.monotonic() - started:.0f} s"
    print(f"{name}: {store / name.replace(':', '+')} ({how})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
