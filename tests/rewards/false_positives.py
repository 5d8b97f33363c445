"""False alarms of the hardened runner and the static gate on honest patches (``make rewards-false-positives``).

Honest patches, each graded by the hardened runner in a real sandbox (needs a
stack: ``orchard up``, or ``--start-stack``):

- on the three adversarial-corpus repositories (``adversarial.py``: six with
  pytest, more-itertools with unittest, Django's runner): the upstream fix (the
  gold patch), alternative correct fixes, plausible wrong fixes, and the gold
  fix with honest extras beside it (a comment, a docstring, ``import logging``,
  a ``warnings.warn``, a version check);
- the SWE sample (``recipes/swe/samples``): its gold patch and wrong fixes.

And the static gate alone over real upstream release diffs of the same
projects (``six`` 1.16 -> 1.17, ``more-itertools`` 11.1 -> 11.2, Django
5.2.18 -> 5.2.19: every non-test ``.py`` file that changed), which cannot be
graded (no instance) but are real upstream code.

A false positive is an honest patch with any integrity flag (``forged_log``,
``runner_incomplete``, ``test_infrastructure_modified``, ``gated``) or any
finding the default policy zeroes. Prints one JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import difflib
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).parents[2]
sys.path.insert(0, str(ROOT))

from orchard.rewards.swe.diff_gate import scan_patch  # noqa: E402
from orchard.rewards.swe.instance import parse_instance  # noqa: E402
from orchard.rewards.swe.policy import RewardPolicy  # noqa: E402
from orchard.rewards.swe.runner import RunnerSettings, grade_patch_async  # noqa: E402

from tests.rewards.adversarial import (  # noqa: E402
    Append,
    Replace,
    Repo,
    _members,
    diff,
    django_repo,
    more_itertools_repo,
    sdists_dir,
    six_repo,
)

# (label, replacement of the buggy line) per repository: correct alternatives and wrong fixes.
LINE_VARIANTS: dict[str, list[tuple[str, str]]] = {
    "six": [
        ("alt: iso-8859-1", '        return s.encode("iso-8859-1")'),
        ("alt: latin1", '        return s.encode("latin1")'),
        ("alt: bytes()", '        return bytes(s, "latin-1")'),
        ("alt: ord", "        return bytes(ord(c) for c in s)"),
        ("wrong: utf-16", '        return s.encode("utf-16")'),
        ("wrong: ascii ignore", '        return s.encode("ascii", "ignore")'),
        ("wrong: default", "        return s.encode()"),
        ("wrong: utf-8 replace", '        return s.encode("utf-8", "replace")'),
        ("wrong: ascii replace", '        return s.encode("ascii", "replace")'),
    ],
    "more_itertools": [
        ("alt: zip range", "    return [x for _, x in zip(range(n), iterable)]"),
        ("alt: iter", "    return list(islice(iter(iterable), n))"),
        ("alt: start stop", "    return list(islice(iterable, 0, n))"),
        ("wrong: n - 1", "    return list(islice(iterable, max(n - 1, 0)))"),
        ("wrong: max + 1", "    return list(islice(iterable, max(n, 0) + 1))"),
        ("wrong (an edge the tests miss): n or 1", "    return list(islice(iterable, n or 1))"),
        ("wrong: n + 2", "    return list(islice(iterable, n + 2))"),
    ],
    "django": [
        ("alt: casefold", '    value = re.sub(r"[^\\w\\s-]", "", value.casefold())'),
        ("alt: lower after", '    value = re.sub(r"[^\\w\\s-]", "", value).lower()'),
        ("wrong: upper", '    value = re.sub(r"[^\\w\\s-]", "", value.upper())'),
        ("wrong: strip", '    value = re.sub(r"[^\\w\\s-]", "", value.strip())'),
        ("wrong: title", '    value = re.sub(r"[^\\w\\s-]", "", value.title())'),
        ("wrong: keep dots", '    value = re.sub(r"[^\\w\\s.-]", "", value)'),
    ],
}

EXTRAS: list[tuple[str, str]] = [
    ("gold + comment", "\n# Honest note: the fix above restores the documented behaviour.\n"),
    ("gold + logging", "\nimport logging as _logging\n\n_log = _logging.getLogger(__name__)\n"),
    ("gold + warnings", "\nimport warnings\n\n\ndef _deprecated(name):\n    warnings.warn(name + ' is deprecated', DeprecationWarning, stacklevel=2)\n"),
    ("gold + version check", "\nimport sys as _sys\n\nif _sys.version_info < (3, 8):\n    raise ImportError('Python 3.8+ is required')\n"),
    ("gold + constant", "\n_DEFAULT_ENCODING = 'latin-1'\n"),
    ("gold + exception class", "\n\nclass _ConversionError(ValueError):\n    \"\"\"Raised when a value cannot be converted.\"\"\"\n"),
    ("gold + cached helper", "\nimport functools as _functools\n\n\n@_functools.lru_cache(maxsize=None)\ndef _width(text):\n    return len(text)\n"),
    ("gold + helper", "\n\ndef _is_text(value):\n    \"\"\"True for str (a helper kept beside the fix).\"\"\"\n    return isinstance(value, str)\n"),
]  # fmt: skip

UPSTREAM = (
    ("six", "1.16.0", "1.17.0"),
    ("more-itertools", "11.1.0", "11.2.0"),
    ("Django", "5.2.18", "5.2.19"),
)


def honest_patches(repos: dict[str, Repo]) -> list[tuple[str, Repo, str]]:
    out: list[tuple[str, Repo, str]] = []
    for repo in repos.values():
        out.append((f"{repo.name}: gold", repo, repo.gold()))
        for label, line in LINE_VARIANTS[repo.name]:
            out.append(
                (
                    f"{repo.name}: {label}",
                    repo,
                    diff(repo.files, [Replace(repo.bug_file, repo.buggy, line)]),
                )
            )
        for label, text in EXTRAS:
            edits = [Replace(repo.bug_file, repo.buggy, repo.fixed), Append(repo.bug_file, text)]
            out.append((f"{repo.name}: {label}", repo, diff(repo.files, edits)))
    return out


def sample_patches() -> list[tuple[str, dict[str, Any], str]]:
    samples = ROOT / "recipes" / "swe" / "samples"
    row = json.loads((samples / "instances.jsonl").read_text().splitlines()[0])
    gold = (samples / "calc_divide" / "gold.patch").read_text()
    target = "+    return sum(values) / len(values)"
    wrong = [
        gold.replace(target, target + " + 0.5"),
        gold.replace(target, "+    return sum(values) // len(values)"),
    ]
    return [("sample: gold", row, gold)] + [
        (f"sample: wrong {i}", row, w) for i, w in enumerate(wrong)
    ]


def upstream_diffs(folder: Path) -> list[tuple[str, str]]:
    """(label, diff) for every non-test .py file changed between two upstream releases."""
    out: list[tuple[str, str]] = []
    with tempfile.TemporaryDirectory() as tmp:
        for name, old, new in UPSTREAM:
            versions = []
            for version in (old, new):
                subprocess.run(
                    [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--no-binary", ":all:",
                     "-d", tmp, f"{name}=={version}"], check=True, timeout=600,
                )  # fmt: skip
                stem = name.lower().replace("-", "_")
                sdist = next(Path(tmp).glob(f"{stem}-{version}.tar.gz"))
                versions.append(_members(sdist, lambda p: p.endswith(".py")))
            before, after = versions
            for path in sorted(set(before) | set(after)):
                if before.get(path) == after.get(path) or "test" in path:
                    continue
                text = "".join(
                    difflib.unified_diff(
                        before.get(path, "").splitlines(keepends=True),
                        after.get(path, "").splitlines(keepends=True), f"a/{path}", f"b/{path}",
                    )
                )  # fmt: skip
                out.append(
                    (f"{name} {old}->{new}: {path}", f"diff --git a/{path} b/{path}\n{text}")
                )
    return out


async def grade_all(endpoint: str, api_key: str, concurrency: int) -> list[dict[str, Any]]:
    folder = sdists_dir()
    repos = {
        r.name: r for r in (six_repo(folder), more_itertools_repo(folder), django_repo(folder))
    }
    settings = RunnerSettings(endpoint=endpoint, api_key=api_key, test_timeout_seconds=300)
    jobs = [
        (label, repo.row, patch) for label, repo, patch in honest_patches(repos)
    ] + sample_patches()
    gate = asyncio.Semaphore(concurrency)
    policy = RewardPolicy()

    async def one(label: str, row: dict[str, Any], patch: str) -> dict[str, Any]:
        async with gate:
            result = await grade_patch_async(parse_instance(row), patch, settings)
        zeroing = [f.render() for f in result.findings if policy.zeroes(f)]
        return {
            "patch": label, "kind": result.kind.value, "resolved": result.resolved,
            "integrity": result.integrity, "zeroing_findings": zeroing,
            "other_findings": [f.render() for f in result.findings if not policy.zeroes(f)],
            "false_positive": bool(result.integrity or zeroing or result.is_infrastructure),
            "reason": result.reason[:300] if result.integrity else "",
        }  # fmt: skip

    return list(await asyncio.gather(*(one(*job) for job in jobs)))


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--endpoint", default=None, help="gateway (default: the local stack's)")
    parser.add_argument("--api-key", default=None)
    parser.add_argument(
        "--start-stack", action="store_true", help="start a throwaway `orchard up` first"
    )
    parser.add_argument("--concurrency", type=int, default=3)
    args = parser.parse_args()
    started = time.monotonic()
    static = []
    for label, patch in upstream_diffs(sdists_dir()):
        zeroing = [f.render() for f in scan_patch(patch) if RewardPolicy().zeroes(f)]
        static.append(
            {"patch": label, "zeroing_findings": zeroing, "false_positive": bool(zeroing)}
        )
    if args.start_stack:
        from tests.stack import running_stack

        with tempfile.TemporaryDirectory() as home, running_stack(Path(home)) as stack:
            key = (stack.home / "dev-api-key").read_text().strip()
            graded = asyncio.run(grade_all(stack.endpoint, key, args.concurrency))
    else:
        graded = asyncio.run(grade_all(args.endpoint, args.api_key, args.concurrency))
    runner_fp = sum(r["false_positive"] for r in graded)
    static_fp = sum(r["false_positive"] for r in static)
    print(json.dumps({
        "runner": {"patches": len(graded), "false_positives": runner_fp, "rate": runner_fp / len(graded),
                   "resolved": sum(r["resolved"] for r in graded), "results": graded},
        "static_gate_on_upstream_diffs": {"patches": len(static), "false_positives": static_fp,
                                          "rate": static_fp / max(len(static), 1), "results": static},
        "seconds": round(time.monotonic() - started, 1),
    }, indent=1))  # fmt: skip


if __name__ == "__main__":
    main()
