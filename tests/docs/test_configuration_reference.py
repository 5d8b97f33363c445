"""docs/reference/configuration.md lists every environment variable the code reads, and only those.

The code is read, not run: ``ast`` over every module of ``src/orchard`` and
``services`` (the generated ``_proto`` aside) collects

- every string literal that is a whole ``ORCHARD_*`` name (constants such as
  ``ENV_CA = "ORCHARD_TLS_CA"``, ``os.environ.get("ORCHARD_HOME")``, the names
  in a ``{field: "ORCHARD_..."}`` table, the variables Orchard sets for its
  children), and
- the literal (or module-constant) argument of every environment read,
  whatever its name: ``os.environ[...]``, ``os.environ.get(...)``,
  ``os.getenv(...)`` and ``env.get(...)`` / ``environ.get(...)`` on a mapping
  of that name (how the settings' ``from_env`` take an injectable environment).

A variable found that the page does not list fails the test (document it); a
variable the page lists that the code no longer mentions fails it too (drop it;
the page's section for the test suite and benchmarks is checked against
``tests/``, ``loadtest/``, ``scripts/`` and the Makefile instead). The generated settings tables must be fresh as well.
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "reference" / "configuration.md"
CODE = (ROOT / "src" / "orchard", ROOT / "services")
ELSEWHERE = (ROOT / "tests", ROOT / "loadtest", ROOT / "scripts", ROOT / "Makefile")
ORCHARD_NAME = re.compile(r"ORCHARD_[A-Z0-9_]*[A-Z0-9]")
ENV_MAPPINGS = {"os.environ", "environ", "env"}
DOCUMENTED_ROW = re.compile(r"^\| `([A-Z][A-Z0-9_]*)` \|", re.MULTILINE)


def _modules(roots: tuple[Path, ...]) -> Iterator[Path]:
    for root in roots:
        for path in sorted(root.rglob("*.py")):
            if "_proto" not in path.parts:
                yield path


def _constants(tree: ast.Module) -> dict[str, str]:
    """Module-level ``NAME = "text"`` assignments."""
    out = {}
    for node in tree.body:
        if (
            isinstance(node, ast.Assign)
            and isinstance(node.value, ast.Constant)
            and isinstance(node.value.value, str)
        ):
            for target in node.targets:
                if isinstance(target, ast.Name):
                    out[target.id] = node.value.value
    return out


def _name_of(arg: ast.expr, constants: dict[str, str]) -> str | None:
    if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
        return arg.value
    if isinstance(arg, ast.Name):
        return constants.get(arg.id)
    return None


def variables_read(tree: ast.Module) -> set[str]:
    constants = _constants(tree)
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            if ORCHARD_NAME.fullmatch(node.value):
                found.add(node.value)
        elif isinstance(node, ast.Call) and node.args:
            func = ast.unparse(node.func)
            receiver, _, method = func.rpartition(".")
            if func == "os.getenv" or (method == "get" and receiver in ENV_MAPPINGS):
                name = _name_of(node.args[0], constants)
                if name:
                    found.add(name)
        elif (
            isinstance(node, ast.Subscript)
            and isinstance(node.ctx, ast.Load)
            and ast.unparse(node.value) in ENV_MAPPINGS
        ):
            name = _name_of(node.slice, constants)
            if name:
                found.add(name)
    return found


def code_variables() -> dict[str, list[str]]:
    """Variable -> the modules that read it."""
    where: dict[str, list[str]] = {}
    for path in _modules(CODE):
        for name in variables_read(ast.parse(path.read_text(), str(path))):
            where.setdefault(name, []).append(str(path.relative_to(ROOT)))
    return where


TEST_SECTION = "\n### The test suite and benchmarks"


def documented() -> set[str]:
    """Every variable the page lists (its tables before the settings)."""
    text = PAGE.read_text().partition("\n## Settings")[0]
    return set(DOCUMENTED_ROW.findall(text))


def documented_for_tests() -> set[str]:
    """The variables of the section read only by tests, benchmarks and scripts."""
    text = PAGE.read_text().partition("\n## Settings")[0].partition(TEST_SECTION)[2]
    return set(DOCUMENTED_ROW.findall(text))


def _mentioned(names: set[str], roots: tuple[Path, ...]) -> set[str]:
    texts = []
    for root in roots:
        if root.is_file():
            texts.append(root.read_text())
            continue
        for path in sorted(root.rglob("*")):
            if path.suffix in (".py", ".sh") and "_proto" not in path.parts:
                texts.append(path.read_text())
    everything = "\n".join(texts)
    return {n for n in names if re.search(rf"\b{n}\b", everything)}


def test_the_scan_sees_the_reads_it_must_see() -> None:
    found = code_variables()
    # One of each kind: a literal read, a module constant, a table of names, a non-ORCHARD read.
    for name in ("ORCHARD_HOME", "ORCHARD_TLS_CA", "ORCHARD_NET_DNS_MAX_PENDING", "KUBECONFIG"):
        assert name in found, name


def test_every_variable_the_code_reads_is_documented() -> None:
    missing = {n: w for n, w in code_variables().items() if n not in documented()}
    assert not missing, (
        "environment variables read by the code but not in docs/reference/configuration.md: "
        + "; ".join(f"{n} ({', '.join(w)})" for n, w in sorted(missing.items()))
    )


def test_every_documented_variable_is_still_read() -> None:
    for_tests = documented_for_tests()
    for_orchard = documented() - for_tests
    # Orchard's own variables must still be in its code (an embedded program's source, such
    # as the SWE witness run inside sandboxes, counts); the test section's in tests and tools.
    gone = sorted(for_orchard - _mentioned(for_orchard, CODE))
    gone += sorted(for_tests - _mentioned(for_tests, ELSEWHERE))
    assert not gone, f"documented but read nowhere any more: {', '.join(gone)}"


def test_the_settings_tables_are_fresh() -> None:
    result = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "gen_config_reference.py"), "--check"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
