"""Files the API creates belong to the sandbox's root (``SandboxFiles(owner=...)``).

With user namespaces the sandbox's root is a host uid of its range
(``SandboxMeta.root_uid``); the executor runs as host root, so what it creates
must be chowned to that uid, or it shows as ``nobody`` inside. Needs root (chown).
"""

from __future__ import annotations

import os
import tarfile
from pathlib import Path

import pytest
from orchard.executor.files import SandboxFiles

from . import tarbuild
from .conftest import Sandbox, chunks, run

OWNER = (1 << 30) + 7 * 65536

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="chown to another uid needs root")


def _owner(path: Path) -> tuple[int, int]:
    st = os.lstat(path)
    return st.st_uid, st.st_gid


def test_write_file_and_its_new_parents_belong_to_the_sandbox_root(sandbox: Sandbox) -> None:
    files = SandboxFiles(sandbox.root, owner=OWNER)
    run(files.write_file("/new/dir/f", 0o755, True, chunks([b"x"])))
    for path in ("new", "new/dir", "new/dir/f"):
        assert _owner(sandbox.root / path) == (OWNER, OWNER), path


def test_a_replaced_file_keeps_its_owner(sandbox: Sandbox) -> None:
    target = sandbox.root / "tmp/kept"
    target.write_bytes(b"old")
    os.chown(target, OWNER + 1000, OWNER + 1000)
    run(SandboxFiles(sandbox.root, owner=OWNER).write_file("/tmp/kept", 0, False, chunks([b"n"])))
    assert _owner(target) == (OWNER + 1000, OWNER + 1000)


def test_upload_gives_files_dirs_and_symlinks_to_the_sandbox_root(sandbox: Sandbox) -> None:
    data = tarbuild.build(
        [
            tarbuild.Member("d", kind=tarfile.DIRTYPE, mode=0o755),
            tarbuild.Member("d/f", data=b"hello"),
            tarbuild.Member("e/g", data=b"implicit parent"),
            tarbuild.Member("d/link", kind=tarfile.SYMTYPE, linkname="f"),
        ]
    )
    files = SandboxFiles(sandbox.root, owner=OWNER)
    run(files.upload("/up", chunks(tarbuild.split(data))))
    for path in ("up", "up/d", "up/d/f", "up/e", "up/e/g", "up/d/link"):
        assert _owner(sandbox.root / path) == (OWNER, OWNER), path


def test_without_a_namespace_files_stay_root(sandbox: Sandbox) -> None:
    run(SandboxFiles(sandbox.root).write_file("/tmp/plain", 0, False, chunks([b"x"])))
    assert _owner(sandbox.root / "tmp/plain") == (0, 0)
