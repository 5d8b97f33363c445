"""A sandbox made from a pulled image: pulled from a real registry into a stack's images
folder, created through the SDK, and a command inside sees the layers' files with the
whiteouts applied and the image's env and working directory.

The image is busybox-static (Debian's, as the injected-runtime tests use) under the
two whiteout layers of the import tests, pushed with skopeo.
"""

from __future__ import annotations

import asyncio
import io
import os
import sys
import tarfile
from pathlib import Path

import pytest
from orchard.recipes.swe.images import MissingImagesError, ensure_images
from orchard.scheduler.backends.local.pull.pull import pull_image

from orchard import Orchard
from tests.injected.busybox_image import busybox_is_static, make_rootfs
from tests.stack import REQUIRES_STACK, running_stack

from .image_inputs import LAYER_1, LAYER_2, layer_tar
from .oci_images import ImageSpec, write_layout
from .registry_server import have_tools, running_registry

pytestmark = [
    *REQUIRES_STACK,
    pytest.mark.skipif(have_tools() is not None, reason=have_tools() or ""),
    pytest.mark.skipif(not busybox_is_static(), reason="needs busybox-static"),
]


def rootfs_layer(root: Path) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for entry in sorted(root.iterdir()):
            tar.add(entry, arcname=entry.name)
    return out.getvalue()


def test_a_sandbox_runs_in_a_pulled_image(tmp_path: Path) -> None:
    rootfs = tmp_path / "rootfs"
    make_rootfs(rootfs)
    spec = ImageSpec(
        [rootfs_layer(rootfs), layer_tar(LAYER_1), layer_tar(LAYER_2)],
        env=["PATH=/bin:/usr/bin:/sbin", "GREETING=from-the-registry"],
    )
    layout = write_layout(tmp_path / "layout", "1", [spec])
    images = tmp_path / "images"
    with running_registry(tmp_path / "reg") as registry:
        registry.push(layout, "1", "swe/busybox-whiteouts")
        registry.push(layout, "1", "swe/second")
        image = asyncio.run(
            pull_image(images, f"{registry.host}/swe/busybox-whiteouts:1", plain_http=True)
        )
        assert image.name == "busybox-whiteouts:1"
        home = tmp_path / "home"
        with running_stack(home, extra_env={"ORCHARD_IMAGES_DIR": str(images)}) as stack:
            client = Orchard(stack.endpoint, (home / "dev-api-key").read_text().strip())
            assert "busybox-whiteouts:1" in {i.name for i in client.images.list()}
            sandbox = client.sandboxes.create(image="busybox-whiteouts:1")
            try:
                result = sandbox.exec(
                    "pwd; echo $GREETING; ls /data; cat /etc/new /etc/keep; "
                    "test -e /etc/hello && echo hello-still-there || echo hello-gone; tool"
                )
                assert result.exit_code == 0, result.stderr
                assert result.stdout.decode().split("\n") == [
                    "/data",
                    "from-the-registry",
                    "c",
                    "new",
                    "keep",
                    "hello-gone",
                    "tool",
                    "",
                ]
            finally:
                sandbox.delete()
            # The recipe's check before its rollouts: one present, one pulled on demand.
            refs = [f"{registry.host}/swe/busybox-whiteouts:1", f"{registry.host}/swe/second:1"]
            with pytest.raises(MissingImagesError) as err:
                ensure_images(refs, client)
            assert list(err.value.missing) == [refs[1]]
            plan = ensure_images(
                refs,
                client,
                pull=True,
                orchard_command=[sys.executable, "-m", "orchard.cli"],
                pull_args=["--plain-http", "--images-dir", str(images)],
            )
            assert plan.pulled == [refs[1]]
            assert plan.names[refs[1]] == "second:1"
            # Both share every layer: the second pull unpacked nothing new.
            assert len(list((images / ".layers").glob("sha256-*"))) == 3
    assert os.path.isdir(images / ".layers")
