"""Produce the real test-log corpus for the grading parity tests (``make rewards-corpus``).

Every log here comes from a real test suite run in a real Orchard sandbox
(default image: Debian bookworm, python3 3.11, pytest 7.2), through the SDK,
wrapped by the same eval script the reward runner uses (markers, stderr
merged, recorded exit code). Sources are PyPI sdists downloaded on the host
(``pip download --no-deps --no-binary :all: NAME``; sandboxes have no network)
and uploaded into the sandbox:

- Django 5.2 (its sdist ships the test suite) + asgiref + sqlparse: Django's
  runner, ``utils_tests.test_text`` and ``utils_tests.test_html``;
- sympy 1.14 + mpmath: sympy's own runner (``sympy.testing.runtests.test``; ``sympy.test`` now wraps pytest), ``sympy/utilities/tests/test_iterables.py``;
- six 1.17: ``pytest -rA test_six.py``;
- more-itertools 11.2: ``python3 -m unittest -v tests.test_recipes``;
- ``edge_project/``: hand-made pytest edge cases, run with ``-rA`` (and ``-rA -v``),
  an empty suite, and a conftest that prints fake PASSED lines then exits 3.

Each project runs twice: as shipped ("fixed") and with a fix reverted (a
one-line bug put back, "buggy"). FAIL_TO_PASS = failing in buggy, passing in
fixed; PASS_TO_PASS = passing in both; ``instances.json`` records them with
the log names. Needs a running stack (``orchard up``) and ~3 minutes.

    .venv/bin/python tests/rewards/corpus/make_corpus.py --sdists DIR
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path

from orchard.rewards.swe.eval_script import eval_script
from orchard.rewards.swe.instance import SweInstance
from orchard.rewards.swe.parsers import get_parser

from orchard import Sandbox

HERE = Path(__file__).parent
PASSING = ("PASSED", "XFAIL")


@dataclass(frozen=True)
class Project:
    name: str
    sdists: tuple[str, ...]
    workdir: str
    test_cmd: str
    parser: str
    bug_file: str
    fixed_text: str
    buggy_text: str
    pythonpath: str = ""


PROJECTS = (
    Project(
        "django", ("django-", "asgiref-", "sqlparse-"), "/src/django/tests",
        "python3 runtests.py --verbosity 2 --parallel 1 utils_tests.test_text utils_tests.test_html",
        "django", "/src/django/django/utils/text.py",
        '    value = re.sub(r"[^\\w\\s-]", "", value.lower())', '    value = re.sub(r"[^\\w\\s-]", "", value)',
        "/src/django:/src/asgiref:/src/sqlparse",
    ),
    Project(
        "sympy", ("sympy-", "mpmath-"), "/src/sympy",
        "python3 -c \"import sys; from sympy.testing.runtests import test; sys.exit(0 if test('sympy/utilities/tests/test_iterables.py', verbose=True, subprocess=False) else 1)\"",
        "sympy", "/src/sympy/sympy/utilities/iterables.py",
        "    return x[y:] + x[:y]", "    return x[y:] + x[:y - 1]",
        "/src/sympy:/src/mpmath",
    ),
    Project(
        "six", ("six-",), "/src/six", "python3 -m pytest -rA -p no:cacheprovider test_six.py",
        "pytest", "/src/six/six.py",
        '        return s.encode("latin-1")', '        return s.encode("utf-8")',
    ),
    Project(
        "more_itertools", ("more_itertools-",), "/src/more_itertools",
        "python3 -m unittest -v tests.test_recipes", "unittest",
        "/src/more_itertools/more_itertools/recipes.py",
        "    return list(islice(iterable, n))", "    return list(islice(iterable, n + 1))",
    ),
)  # fmt: skip


def _unpack(sdists: Path, prefixes: tuple[str, ...], into: Path) -> None:
    for prefix in prefixes:
        found = sorted(sdists.glob(f"{prefix}*.tar.gz"))
        if not found:
            sys.exit(
                f"no sdist {prefix}*.tar.gz in {sdists} (pip download --no-deps --no-binary :all:)"
            )
        with tarfile.open(found[-1]) as tar:
            top = tar.getnames()[0].split("/")[0]
            tar.extractall(into, filter="data")
        (into / top).rename(into / prefix.rstrip("-"))


def _run(sb: Sandbox, workdir: str, test_cmd: str, env: str) -> str:
    instance = SweInstance("corpus", "", f"{env}{test_cmd}", "pytest", [], [], workdir=workdir)
    sb.write_file("/tmp/eval.sh", eval_script(instance).encode(), mode=0o755)
    result = sb.exec(["bash", "-c", "/tmp/eval.sh 2>&1"], timeout=900)
    assert not result.timed_out, "corpus run timed out"
    return result.stdout_text


def _derive(parser: str, buggy: str, fixed: str) -> tuple[list[str], list[str]]:
    parse = get_parser(parser)
    before, after = parse(buggy), parse(fixed)
    f2p = sorted(t for t, s in after.items() if s in PASSING and before.get(t) not in PASSING)
    p2p = sorted(t for t, s in after.items() if s in PASSING and before.get(t) in PASSING)
    return f2p, p2p


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--sdists", type=Path, required=True, help="folder of downloaded sdists")
    parser.add_argument("--only", nargs="*", default=None, help="project names to (re)make")
    args = parser.parse_args()
    logs = HERE / "logs"
    logs.mkdir(exist_ok=True)
    manifest_path = HERE / "instances.json"
    manifest = json.loads(manifest_path.read_text()) if manifest_path.exists() else {}
    with Sandbox.create(cpu=2, memory="4Gi", ttl=3600) as sb, tempfile.TemporaryDirectory() as tmp:
        for project in PROJECTS:
            if args.only is not None and project.name not in args.only:
                continue
            src = Path(tmp) / project.name
            src.mkdir()
            _unpack(args.sdists, project.sdists, src)
            sb.upload(src, "/src")
            env = f"export PYTHONPATH={project.pythonpath}; " if project.pythonpath else ""
            fixed = _run(sb, project.workdir, project.test_cmd, env)
            swap = (
                "import sys, pathlib; p = pathlib.Path(sys.argv[1]); t = p.read_text(); "
                "assert sys.argv[2] in t, 'fix not found'; p.write_text(t.replace(sys.argv[2], sys.argv[3], 1))"
            )
            swapped = sb.exec(
                ["python3", "-c", swap, project.bug_file, project.fixed_text, project.buggy_text]
            )
            assert swapped.exit_code == 0, swapped.stderr_text
            buggy = _run(sb, project.workdir, project.test_cmd, env)
            sb.exec(
                ["python3", "-c", swap, project.bug_file, project.buggy_text, project.fixed_text]
            )
            (logs / f"{project.name}_fixed.log").write_text(fixed)
            (logs / f"{project.name}_buggy.log").write_text(buggy)
            f2p, p2p = _derive(project.parser, buggy, fixed)
            manifest[project.name] = {
                "parser": project.parser, "logs": [f"{project.name}_fixed.log", f"{project.name}_buggy.log"],
                "FAIL_TO_PASS": f2p, "PASS_TO_PASS": p2p,
            }  # fmt: skip
            print(f"{project.name}: F2P {len(f2p)} P2P {len(p2p)}", flush=True)
        if args.only is None or "edge" in args.only:
            sb.upload(HERE / "edge_project", "/edge")
            runs = {
                "edge_rA": "python3 -m pytest -rA -p no:cacheprovider test_edge.py",
                "edge_rA_verbose": "python3 -m pytest -rA -v -p no:cacheprovider test_edge.py",
                "edge_empty": "python3 -m pytest -rA -p no:cacheprovider empty",
                "edge_liar": "python3 -m pytest -rA -p no:cacheprovider liar",
            }
            for name, cmd in runs.items():
                (logs / f"{name}.log").write_text(_run(sb, "/edge", cmd, ""))
                print(f"{name}: done", flush=True)
    manifest_path.write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")
    subprocess.run(["git", "add", "-N", str(logs)], cwd=HERE, check=False)


if __name__ == "__main__":
    main()
