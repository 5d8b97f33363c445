"""``python -m orchard.recipes.claw``: the Claw recipe end to end, and the task check.

::

    python -m orchard.recipes.claw run --out runs/c1 --model NAME
        [--tasks bundled|PATH ...] [--only ID,...] [--harness react,codex] [--k 3]
        [--concurrency 4] [--max-steps 30] [--max-seconds 600] [--proxy URL] [--template NAME]

    python -m orchard.recipes.claw check --out runs/check [--tasks ...] [--only ...]

Against the stack of ``$ORCHARD_HOME`` (or ``ORCHARD_ENDPOINT`` / ``ORCHARD_API_KEY``): the
sandboxes through the SDK, the model through the recording proxy (``--proxy``, default the
URL ``orchard up`` wrote; its ``--model-upstream`` is the inference server: a real
OpenAI-compatible endpoint, or in the tests the scripted model server).

``run`` runs ``--k`` trials of every task on every ``--harness`` (comma-separated: ``react``,
the built-in ReAct loop; a tools-layer CLI by name, ``codex``, ``openclaw``, ...; or
``MODULE:ATTR``) and writes into ``--out``:

- ``trials.jsonl``: one line per trial (status, fault, score with components and
  violations, final answer, the audit log and state the grader read, transcript);
- ``metrics.json`` / ``metrics.md`` / ``metrics.txt``: pass^k, pass@k and mean score per
  harness, per category and overall (:mod:`orchard.recipes.claw.metrics`);
- ``samples.rl.jsonl``: every recorded training sample of every trial (the proxy's, the
  trial's score spread on them as the reward; ``trainable`` false where a fault masks them),
  tagged with ``task_id``, ``trial_id``, ``harness``, ``category``;
- ``samples.sft.jsonl``: the trainable samples of passed trials (rejection sampling);
- ``run.json``: the options, the counts, and every ABORTED trial with its fault (they are
  infrastructure faults: not counted as failures, listed here instead).

``check`` runs every task's oracle and a null run once (real sandboxes, no model) and writes
``check.json``: per task whether it is valid (the oracle passes, the null run fails) and why
not; it exits 1 when any task is not valid.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import json
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, cast

import orchard
from orchard.rollouts import Harness, Limits, ModelProxyClient, SandboxOptions, local_proxy_url
from orchard.rollouts.harnesses import HARNESSES

from .bundled import TASKS_DIR
from .harness import AnyHarness
from .metrics import markdown_table, summarize, text_table
from .react import ReactConfig, ReactHarness
from .runner import ClawTrial, check_tasks, run_trials
from .tasks import ClawTask, TaskFormatError, load_tasks


def harness_of(spec: str, ca: str | None) -> AnyHarness:
    """``react`` (the built-in loop), a tools-layer CLI by name, or ``MODULE:ATTR`` (a harness,
    or a class or callable making one)."""
    if spec == "react":
        return ReactHarness(ReactConfig(), ca=ca)
    if spec in HARNESSES:  # a CliHarness (its name is a class attribute: cast to the protocol)
        return cast(Harness, HARNESSES[spec]())
    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        known = ", ".join(["react", *sorted(HARNESSES)])
        raise SystemExit(f"--harness: one of {known}, or MODULE:ATTR; not {spec!r}")
    try:
        value = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as err:
        raise SystemExit(f"--harness {spec}: {err}") from None
    harness = value() if isinstance(value, type) or not hasattr(value, "name") else value
    if not hasattr(harness, "name") or not (
        hasattr(harness, "run") or hasattr(harness, "run_claw")
    ):
        raise SystemExit(f"--harness {spec}: not a harness (no name and run/run_claw)")
    return harness  # type: ignore[no-any-return]


def read_tasks(specs: Sequence[str], only: str) -> list[ClawTask]:
    paths = [TASKS_DIR if s == "bundled" else Path(s) for s in (specs or ["bundled"])]
    try:
        tasks = load_tasks(*paths)
    except TaskFormatError as err:
        raise SystemExit(f"--tasks: {err}") from None
    if only:
        keep = set(only.split(","))
        unknown = keep - {t.id for t in tasks}
        if unknown:
            raise SystemExit(f"--only: no such task: {', '.join(sorted(unknown))}")
        tasks = [t for t in tasks if t.id in keep]
    if not tasks:
        raise SystemExit("--tasks: no tasks")
    return tasks


def _write_jsonl(path: Path, rows: Sequence[Mapping[str, Any]]) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    with tmp.open("w") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False, default=str) + "\n")
    tmp.replace(path)


def samples_of(trials: Sequence[ClawTrial]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(RL samples of every trial, SFT samples of the passed trials), each tagged."""
    rl, sft = [], []
    for t in trials:
        tags = {"task_id": t.task_id, "trial_id": f"{t.task_id}#{t.harness}#{t.index}",
                "harness": t.harness, "category": t.task.category, "passed": t.passed}  # fmt: skip
        for sample in t.result.samples:
            tagged = {**sample, **tags}
            rl.append(tagged)
            if t.passed and sample.get("trainable"):
                sft.append(tagged)
    return rl, sft


async def _with_stack(body: Any, proxy_arg: str) -> Any:
    async with orchard.AsyncOrchard() as client:
        proxy_url = proxy_arg or local_proxy_url(client.config.home)
        ca = str(client.config.home / "run" / "ca.pem") if proxy_url.startswith("https") else None
        async with ModelProxyClient(proxy_url, client.config.api_key, ca=ca) as proxy:
            return await body(client, proxy, ca)


def _progress(trial: ClawTrial) -> None:
    score = "-" if trial.score is None else f"{trial.score.total:.2f}"
    fault = f" fault={trial.result.fault}" if trial.result.fault else ""
    print(f"{trial.task_id} {trial.harness}#{trial.index} {trial.result.status} "
          f"score={score} passed={trial.passed}{fault}", flush=True)  # fmt: skip


def run(args: argparse.Namespace) -> int:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    tasks = read_tasks(args.tasks, args.only)
    specs = [s.strip() for s in args.harness.split(",") if s.strip()]
    if not specs:
        raise SystemExit("--harness: give at least one")
    limits = Limits(max_steps=args.max_steps, max_seconds=args.max_seconds,
                    command_timeout=args.command_timeout)  # fmt: skip
    started = time.monotonic()

    async def body(client: orchard.AsyncOrchard, proxy: ModelProxyClient, ca: str | None) -> Any:
        harnesses = [harness_of(s, ca) for s in specs]
        try:
            return await run_trials(
                client, harnesses, tasks, proxy=proxy, model=args.model, k=args.k,
                limits=limits, sandbox=SandboxOptions(template=args.template or None),
                concurrency=args.concurrency, model_version=args.model_version,
                on_trial=_progress,
            )  # fmt: skip
        finally:
            for h in harnesses:
                close = getattr(h, "aclose", None)
                if close is not None:
                    await close()

    trials: list[ClawTrial] = asyncio.run(_with_stack(body, args.proxy))
    _write_jsonl(out / "trials.jsonl", [t.record() for t in trials])
    report = summarize([t.outcome() for t in trials], k=args.k)
    (out / "metrics.json").write_text(json.dumps(report.to_json(), indent=2) + "\n")
    (out / "metrics.md").write_text(markdown_table(report))
    text = text_table(report)
    (out / "metrics.txt").write_text(text)
    rl, sft = samples_of(trials)
    _write_jsonl(out / "samples.rl.jsonl", rl)
    _write_jsonl(out / "samples.sft.jsonl", sft)
    aborted = [{"trial_id": f"{t.task_id}#{t.harness}#{t.index}", "fault": t.result.fault}
               for t in trials if t.aborted]  # fmt: skip
    summary = {
        "tasks": len(tasks), "harnesses": [t for t in specs], "k": args.k,
        "trials": len(trials), "passed": sum(t.passed for t in trials),
        "aborted": aborted, "samples": {"rl": len(rl), "sft": len(sft)},
        "seconds": round(time.monotonic() - started, 2), "options": vars(args),
    }  # fmt: skip
    (out / "run.json").write_text(json.dumps(summary, indent=2) + "\n")
    print(text, end="")
    if aborted:
        print(f"{len(aborted)} trial(s) aborted (infrastructure; not counted): see run.json")
    print(f"wrote {out}")
    return 0


def check(args: argparse.Namespace) -> int:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    tasks = read_tasks(args.tasks, args.only)

    async def body(client: orchard.AsyncOrchard, proxy: ModelProxyClient, ca: str | None) -> Any:
        return await check_tasks(client, tasks, proxy=proxy, concurrency=args.concurrency)

    checks = asyncio.run(_with_stack(body, args.proxy))
    rows = [
        {"task_id": c.task.id, "category": c.task.category, "valid": c.valid, "why": c.why,
         "oracle": None if c.oracle.score is None else c.oracle.score.total,
         "null": None if c.null.score is None else c.null.score.total,
         "oracle_errors": (c.oracle.result.detail.get("harness") or {}).get("oracle_errors", [])}
        for c in checks
    ]  # fmt: skip
    (out / "check.json").write_text(json.dumps(rows, indent=2) + "\n")
    for row in rows:
        print(f"{row['task_id']}: {'valid' if row['valid'] else 'NOT VALID: ' + row['why']}")
    bad = sum(not r["valid"] for r in rows)
    print(f"{len(rows) - bad} of {len(rows)} valid; wrote {out / 'check.json'}")
    return 1 if bad else 0


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m orchard.recipes.claw", description=__doc__.split("\n")[0]
    )
    sub = p.add_subparsers(dest="command", required=True)
    r = sub.add_parser("run", help="k trials per task per harness; metrics and samples")
    c = sub.add_parser("check", help="oracle and null run of every task: which are valid")
    for q in (r, c):
        q.add_argument("--tasks", action="append", default=[],
                       help="'bundled' (the default) or a task file/directory (repeatable)")  # fmt: skip
        q.add_argument("--only", default="", help="comma-separated task ids to keep")
        q.add_argument("--out", required=True, help="output directory")
        q.add_argument("--proxy", default="", help="model proxy URL (default: the local stack's)")
        q.add_argument("--concurrency", type=int, default=4)
    r.add_argument("--model", required=True, help="the model name sent to the proxy")
    r.add_argument("--model-version", default="", help="the policy version recorded")
    r.add_argument("--harness", default="react",
                   help="comma-separated: react, a tools-layer CLI (codex, openclaw, ...) "
                   "or MODULE:ATTR")  # fmt: skip
    r.add_argument("--k", type=int, default=3, help="trials per task per harness")
    r.add_argument("--template", default="", help="claim sandboxes from this warm pool")
    r.add_argument("--max-steps", type=int, default=30)
    r.add_argument("--max-seconds", type=float, default=600.0)
    r.add_argument("--command-timeout", type=float, default=60.0)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.concurrency < 1 or getattr(args, "k", 1) < 1:
        raise SystemExit("--k and --concurrency must be at least 1")
    return run(args) if args.command == "run" else check(args)


if __name__ == "__main__":
    sys.exit(main())
