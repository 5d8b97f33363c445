"""The executor bundle on its own: ldd parsing, relocation, the tarball, the cache.

Building needs gcc and ldd (the bundle fixture builds once per cache key);
running it in a chroot that holds nothing but the bundle needs root.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tarfile
from pathlib import Path

import pytest
from orchard.executor.bundle import copy_bundle, ensure_bundle, write_tarball
from orchard.executor.bundle.builder import MANIFEST, bundled_python_argv, bundled_python_env
from orchard.executor.bundle.elf_deps import ElfDepsError, parse_ldd

PROBE = (
    "import sys, ssl, uvloop, orchard.executor.server, orchard.executor.files; "
    "print(sys.prefix); print('\\n'.join(sys.path))"
)

LDD_OUTPUT = """\
\tlinux-vdso.so.1 (0x00007ffd4a7f2000)
\tlibpython3.11.so.1.0 => /opt/py/lib/libpython3.11.so.1.0 (0x00007f0d4f000000)
\tlibc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x00007f0d4ee1e000)
\t/lib64/ld-linux-x86-64.so.2 (0x00007f0d4f728000)
"""


def test_parse_ldd_finds_libraries_and_the_loader() -> None:
    libraries, loader = parse_ldd(LDD_OUTPUT, "python3")
    assert libraries == {
        "libpython3.11.so.1.0": Path("/opt/py/lib/libpython3.11.so.1.0"),
        "libc.so.6": Path("/lib/x86_64-linux-gnu/libc.so.6"),
    }
    assert loader == Path("/lib64/ld-linux-x86-64.so.2")


def test_parse_ldd_refuses_a_missing_library() -> None:
    with pytest.raises(ElfDepsError, match=r"libmissing\.so\.1"):
        parse_ldd("\tlibmissing.so.1 => not found\n", "x.so")


def _probe(bundle: Path, root: Path | None = None) -> list[str]:
    inner = bundle if root is None else Path("/") / bundle.relative_to(root)
    argv = bundled_python_argv(inner, "-c", PROBE)
    if root is not None:
        argv = [shutil.which("chroot") or "/usr/sbin/chroot", str(root), *argv]
    proc = subprocess.run(
        argv, env=bundled_python_env(inner), cwd="/", capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.splitlines()


def test_the_bundle_is_relocatable(bundle: Path, tmp_path: Path) -> None:
    moved = copy_bundle(bundle, tmp_path / "elsewhere" / "bundle")
    lines = _probe(moved)
    assert lines[0] == str(moved)
    assert all(entry.startswith(str(moved)) for entry in lines[1:] if entry), lines


@pytest.mark.runc
def test_the_bundle_runs_in_a_root_that_holds_nothing_else(bundle: Path, tmp_path: Path) -> None:
    root = tmp_path / "empty-root"
    copy_bundle(bundle, root / "b")
    assert sorted(os.listdir(root)) == ["b"]
    assert _probe(root / "b", root)[0] == "/b"


def test_the_tarball_unpacks_to_a_working_bundle(bundle: Path, tmp_path: Path) -> None:
    tarball = write_tarball(bundle, tmp_path / "bundle.tar.gz")
    out = tmp_path / "unpacked"
    with tarfile.open(tarball) as archive:
        archive.extractall(out, filter="tar")
    assert (out / MANIFEST).is_file()
    assert _probe(out)[0] == str(out)


def test_the_cache_reuses_a_built_bundle(bundle: Path) -> None:
    before = (bundle / MANIFEST).stat().st_mtime_ns
    assert ensure_bundle() == bundle
    assert (bundle / MANIFEST).stat().st_mtime_ns == before
    # Nothing host-specific is left in the bundle's native files but what ldd resolved.
    assert shutil.which("ldd") is not None
    assert (bundle / "lib" / "ld-linux-x86-64.so.2").is_file()
