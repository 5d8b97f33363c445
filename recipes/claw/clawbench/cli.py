"""``python -m orchard.recipes.claw.clawbench``: list, check and triage claw-bench's tasks.

::

    python -m orchard.recipes.claw.clawbench list [--json]
    python -m orchard.recipes.claw.clawbench check [--only ID,...] [--category NAME,...]
        [--concurrency 4] [--image NAME] [--out FILE] [--write-triage] [--proxy URL]
    python -m orchard.recipes.claw.clawbench triage [--json]
    python -m orchard.recipes.claw.clawbench export --out DIR|FILE.jsonl [--all] [--only ID,...]

``check`` runs every chosen task's reference solution and a null run in real sandboxes (the
stack of ``$ORCHARD_HOME``, or ``ORCHARD_ENDPOINT`` / ``ORCHARD_API_KEY``; the recording proxy
``orchard up`` started, or ``--proxy``), prints one line per task and the counts, writes the
verdicts as JSON (``--out``), and with ``--write-triage`` (only for a run over every task)
rewrites the checked-in :data:`.triage_file.TRIAGE_PATH`. Its exit code is 0 when no run failed
for the platform's reasons and, for a task the checked-in triage accepts, the verdict is still
"accepted" (1 otherwise: the triage is stale, or the stack is broken). ``triage`` prints the
checked-in triage: the counts, the reasons, every refused task and why. ``export`` writes the
accepted tasks (``--all``: every readable one) as Claw task JSON, one ``<id>.json`` per task
or one JSONL file, for ``python -m orchard.recipes.claw run --tasks DIR`` (k trials per
harness, pass^k and pass@k).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import orchard
from orchard.rollouts import ModelProxyClient, local_proxy_url

from ..tasks import save_tasks
from .check import CheckRun, run_check
from .convert import claw_tasks
from .source import BenchTask, Catalogue, load_catalogue
from .triage import Verdict
from .triage_file import TRIAGE_PATH, load_triage, triage_json, write_triage


def _chosen(catalogue: Catalogue, only: str, categories: str) -> list[BenchTask] | None:
    if not only and not categories:
        return None
    tasks = catalogue.tasks
    if only:
        wanted = [t.strip() for t in only.split(",") if t.strip()]
        unknown = sorted(set(wanted) - {t.id for t in tasks})
        if unknown:
            raise SystemExit(f"clawbench: no task {', '.join(unknown)} in claw-bench")
        tasks = [t for t in tasks if t.id in wanted]
    if categories:
        names = {c.strip() for c in categories.split(",") if c.strip()}
        unknown = sorted(names - {t.domain for t in catalogue.tasks})
        if unknown:
            raise SystemExit(f"clawbench: no category {', '.join(unknown)} in claw-bench")
        tasks = [t for t in tasks if t.domain in names]
    return tasks


def _line(v: Verdict) -> str:
    return f"{v.status:<9} {v.id:<12} {v.category:<20} {v.reason or '-':<16} {v.detail[:160]}"


def _summary(run: CheckRun) -> str:
    counts = ", ".join(f"{k} {n}" for k, n in sorted(run.counts().items()))
    reasons = ", ".join(f"{k} {n}" for k, n in run.reasons().items()) or "none"
    return (f"claw-bench {run.version}: {len(run.verdicts)} tasks checked in {run.seconds:.1f} s: "
            f"{counts}; not accepted: {reasons}")  # fmt: skip


async def _run_check(args: argparse.Namespace, catalogue: Catalogue) -> CheckRun:
    tasks = _chosen(catalogue, args.only, args.category)
    async with orchard.AsyncOrchard() as client:
        proxy_url = args.proxy or local_proxy_url(client.config.home)
        ca = str(client.config.home / "run" / "ca.pem") if proxy_url.startswith("https") else None
        async with ModelProxyClient(proxy_url, client.config.api_key, ca=ca) as proxy:
            return await run_check(
                client, proxy, catalogue, tasks, concurrency=args.concurrency, image=args.image,
                on_verdict=lambda v: print(_line(v), flush=True),
            )  # fmt: skip


def _check(args: argparse.Namespace) -> int:
    if args.concurrency < 1:
        raise SystemExit("clawbench: --concurrency must be at least 1")
    if args.write_triage and (args.only or args.category):
        raise SystemExit("clawbench: --write-triage needs a run over every task (no --only)")
    catalogue = load_catalogue()
    run = asyncio.run(_run_check(args, catalogue))
    print(_summary(run))
    if args.out:
        body = json.dumps({**triage_json(run), "seconds": run.seconds}, indent=1)
        Path(args.out).write_text(body + "\n")
    if args.write_triage:
        write_triage(run)
        print(f"wrote {TRIAGE_PATH}")
    return _verdict_code(run)


def _verdict_code(run: CheckRun) -> int:
    errors = [v for v in run.verdicts if v.status == "error"]
    try:
        accepted = {e["id"] for e in load_triage()["tasks"] if e["status"] == "accepted"}
    except FileNotFoundError:
        accepted = set()
    lost = [v for v in run.verdicts if v.id in accepted and v.status != "accepted"]
    for v in errors:
        print(f"error: {v.id}: {v.detail}", file=sys.stderr)
    for v in lost:
        print(f"stale triage: {v.id} is accepted there, {v.status} now ({v.reason}: {v.detail})",
              file=sys.stderr)  # fmt: skip
    return 1 if errors or lost else 0


def _list(args: argparse.Namespace) -> int:
    catalogue = load_catalogue()
    if args.json:
        rows: list[dict[str, Any]] = [
            {"id": t.id, "rel": t.rel, "category": t.domain, "level": t.level, "title": t.title}
            for t in catalogue.tasks
        ]
        rows += [{"id": m.id, "rel": m.rel, "malformed": m.reason} for m in catalogue.malformed]
        print(json.dumps(rows, indent=1))
        return 0
    for t in catalogue.tasks:
        print(f"{t.id:<12} {t.domain:<20} {t.level}  {t.title}")
    for m in catalogue.malformed:
        print(f"{m.id:<12} malformed: {m.reason}")
    print(f"{catalogue.total} task folders in {catalogue.root} (claw-bench {catalogue.version})")
    return 0


def _triage(args: argparse.Namespace) -> int:
    data = load_triage()
    if args.json:
        print(json.dumps(data, indent=1))
        return 0
    print(f"claw-bench {data['claw_bench']}, image {data['image'] or 'default'}: "
          f"{data['counts']}")  # fmt: skip
    for reason, n in data["reasons"].items():
        print(f"  {reason}: {n}")
    for entry in data["tasks"]:
        if entry["status"] != "accepted":
            print(f"{entry['id']:<12} {entry['reason']:<16} {entry['detail']}")
    return 0


def _export(args: argparse.Namespace) -> int:
    only = [t.strip() for t in args.only.split(",") if t.strip()]
    tasks = claw_tasks(accepted_only=not args.all, only=only)
    written = save_tasks(tasks, args.out)
    print(f"wrote {len(tasks)} claw-bench tasks to {args.out} ({len(written)} file(s))")
    return 0


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m orchard.recipes.claw.clawbench",
                                description="claw-bench's tasks on Orchard")  # fmt: skip
    sub = p.add_subparsers(dest="command", required=True)
    ls = sub.add_parser("list", help="the tasks the installed claw-bench ships")
    ls.add_argument("--json", action="store_true")
    ck = sub.add_parser("check", help="reference and null runs in real sandboxes")
    ck.add_argument("--only", default="", help="comma-separated task ids")
    ck.add_argument("--category", default="", help="comma-separated categories (domains)")
    ck.add_argument("--concurrency", type=int, default=4)
    ck.add_argument("--image", default=None, help="image name (default: the server's)")
    ck.add_argument("--out", default="", help="write the verdicts as JSON here")
    ck.add_argument("--write-triage", action="store_true", help=f"rewrite {TRIAGE_PATH.name}")
    ck.add_argument("--proxy", default="", help="model proxy URL (default: the local stack's)")
    tr = sub.add_parser("triage", help="the checked-in triage: accepted, refused and why")
    tr.add_argument("--json", action="store_true")
    ex = sub.add_parser("export", help="the tasks as Claw task JSON, for the Claw runner")
    ex.add_argument("--out", required=True, help="a directory, or a .jsonl file")
    ex.add_argument("--all", action="store_true", help="every readable task, not only accepted")
    ex.add_argument("--only", default="", help="comma-separated task ids")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.command == "check":
        return _check(args)
    if args.command == "list":
        return _list(args)
    if args.command == "export":
        return _export(args)
    return _triage(args)
