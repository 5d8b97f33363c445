"""A busybox-only image for the injected runtime: no libc, no Python, no bash.

Made from Debian's ``busybox-static`` (one static binary) and its applet
links, plus the /etc/passwd and /etc/group the executor tests expect (root,
alice 1000, staff 50 with alice), imported with the local runtime's
``import_image`` for rootfs folders. Its name carries a hash of everything
that went in, so a changed recipe is a new image and an existing one is reused.
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import tempfile
from pathlib import Path

from orchard.scheduler.backends.base import BackendError
from orchard.scheduler.backends.local.image_import import import_image
from orchard.scheduler.backends.local.images import ImageStore, normalize_image_name

BUSYBOX = Path("/bin/busybox")
PASSWD = (
    "root:x:0:0:root:/root:/bin/sh\n"
    "alice:x:1000:1000:Alice:/home/alice:/bin/sh\n"
    "nobody:x:65534:65534:nobody:/nonexistent:/bin/false\n"
)
GROUP = "root:x:0:\nalice:x:1000:\nstaff:x:50:alice\nnogroup:x:65534:\n"


def busybox_is_static() -> bool:
    if not BUSYBOX.is_file():
        return False
    out = subprocess.run(["ldd", str(BUSYBOX)], capture_output=True, text=True, check=False)
    return "not a dynamic executable" in out.stdout + out.stderr


def _applets() -> list[str]:
    out = subprocess.run(
        [str(BUSYBOX), "--list-full"], capture_output=True, text=True, check=True
    ).stdout
    return sorted(line.strip() for line in out.splitlines() if line.strip())


def image_name() -> str:
    h = hashlib.sha256(BUSYBOX.read_bytes())
    h.update(PASSWD.encode() + GROUP.encode() + "\n".join(_applets()).encode())
    return f"busybox:injected-{h.hexdigest()[:12]}"


def make_rootfs(root: Path) -> None:
    for folder in ("bin", "sbin", "usr/bin", "usr/sbin", "etc", "tmp", "root", "home/alice"):
        (root / folder).mkdir(parents=True, exist_ok=True)
    (root / "tmp").chmod(0o1777)
    shutil.copy2(BUSYBOX, root / "bin" / "busybox")
    for applet in _applets():
        link = root / applet
        if link.name == "busybox" or link.exists():
            continue
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to("/bin/busybox")
    (root / "etc" / "passwd").write_text(PASSWD)
    (root / "etc" / "group").write_text(GROUP)


def ensure_busybox_image(images_dir: Path) -> str:
    """The image's name, imported into ``images_dir`` if not there yet."""
    name = normalize_image_name(image_name())
    if ImageStore(images_dir).exists(name):
        return name
    with tempfile.TemporaryDirectory(prefix="oe-busybox-") as tmp:
        root = Path(tmp) / "rootfs"
        make_rootfs(root)
        try:
            import_image(root, name, images_dir)
        except BackendError:
            # Another process (an xdist worker of the same run) imported it meanwhile.
            if not ImageStore(images_dir).exists(name):
                raise
    return name
