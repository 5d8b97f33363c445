"""``python -m orchard.recipes.swe run``: the recipe end to end over a task set.

::

    python -m orchard.recipes.swe run --out runs/r1 [--tasks FILE.jsonl] [--samples 4]
        [--k 1,2,4] --model NAME [--proxy URL] [--harness bash|MODULE:ATTR]
        [--concurrency 8] [--template NAME] [--max-steps 50] [--max-seconds 1800] [--max-tokens N]

Against the stack of ``$ORCHARD_HOME`` (or ``ORCHARD_ENDPOINT`` / ``ORCHARD_API_KEY``): the
sandboxes and the rewards service through the SDK, the model through the recording proxy
(``--proxy``, default the URL ``orchard up`` wrote to ``<home>/run/modelproxy.addr``; the proxy's
``--model-upstream`` is the inference server). It writes into ``--out``:

- ``rollouts.jsonl``: one line per rollout (status, steps, diff, transcript, grade, reward);
- ``rewards.jsonl``: the rewards alone (task, rollout, status, reward, resolved, kind);
- ``samples.rl.jsonl``: every recorded training sample of every rollout (the proxy's samples,
  reward spread on them; ``trainable`` false where a fault masks them);
- ``samples.sft.jsonl``: the trainable samples of resolved rollouts (rejection sampling);
- ``rerank_store.jsonl``: the graded rollouts in the reranker's store format
  (``python -m orchard.rewards.rerank train`` trains the value model on it);
- ``eval.json`` / ``eval.txt``: pass@1, pass@k, best-of-N with the reranker;
- ``run.json``: the options and the counts.

BAR groups and credit-assignment SFT data come from ``orchard.recipes.swe.bar`` and
``orchard.recipes.swe.casft`` when those modules are installed (:func:`post_run_hooks`).
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import json
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import orchard
from orchard.rollouts import (
    Harness,
    Limits,
    ModelProxyClient,
    SandboxOptions,
    Task,
    local_proxy_url,
)

from .agent import AgentConfig, BashAgent
from .evaluate import compact_trajectory, evaluate, table
from .instances import SAMPLES, load_tasks
from .runner import SweOptions, SweRollout, run_swe

HOOKS = ("orchard.recipes.swe.bar", "orchard.recipes.swe.casft")
"""Modules whose ``run_hook(out_dir, records) -> list[Path]`` runs after grading (BAR groups,
CA-SFT data); a module not installed is skipped and said so in ``run.json``."""


def harness_of(spec: str, config: AgentConfig, ca: str | None = None) -> Harness:
    """``bash`` (the built-in loop) or ``MODULE:ATTR``: a Harness, or a class or callable making one
    (a real harness of the tools layer)."""
    if spec == "bash":
        return BashAgent(config, ca=ca)
    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise SystemExit(f"--harness: 'bash' or MODULE:ATTR, not {spec!r}")
    try:
        value = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as err:
        raise SystemExit(f"--harness {spec}: {err}") from None
    harness = value
    if isinstance(value, type) or (callable(value) and not hasattr(value, "run")):
        try:
            harness = value()
        except TypeError as err:
            raise SystemExit(f"--harness {spec}: {err}") from None
    if not hasattr(harness, "run") or not hasattr(harness, "name"):
        raise SystemExit(f"--harness {spec}: not a Harness (no name/run)")
    return harness  # type: ignore[no-any-return]


def _write_jsonl(path: Path, rows: Sequence[dict[str, Any]]) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    with tmp.open("w") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
    tmp.replace(path)


def post_run_hooks(out: Path, records: list[dict[str, Any]]) -> dict[str, Any]:
    """Run the recipe's post-run modules (BAR groups, CA-SFT) on the graded records."""
    report: dict[str, Any] = {}
    for name in HOOKS:
        try:
            module = importlib.import_module(name)
        except ImportError:
            report[name] = "not installed"
            continue
        hook: Callable[[Path, list[dict[str, Any]]], Any] | None = getattr(module, "run_hook", None)
        if hook is None:
            report[name] = "no run_hook"
            continue
        report[name] = [str(p) for p in hook(out, records) or ()]
    return report


def write_outputs(
    out: Path, rollouts: Sequence[SweRollout], prompts: dict[str, str]
) -> list[dict[str, Any]]:
    records = [r.record() for r in rollouts]
    _write_jsonl(out / "rollouts.jsonl", records)
    _write_jsonl(
        out / "rewards.jsonl",
        [{k: rec[k] for k in ("rollout_id", "task_id", "status", "reward", "resolved",
                              "fault", "grade_fault")}
         | {"kind": rec["grade"].get("kind")} for rec in records],
    )  # fmt: skip
    rl: list[dict[str, Any]] = []
    sft: list[dict[str, Any]] = []
    for r, rec in zip(rollouts, records, strict=True):
        for sample in r.result.samples:
            tagged = {**sample, "task_id": rec["task_id"], "rollout_id": rec["rollout_id"]}
            rl.append(tagged)
            if r.resolved and sample.get("trainable"):
                sft.append(tagged)
    _write_jsonl(out / "samples.rl.jsonl", rl)
    _write_jsonl(out / "samples.sft.jsonl", sft)
    store = [
        {"task_id": rec["task_id"], "task": prompts.get(rec["task_id"], ""),
         "trajectory": compact_trajectory(rec["transcript"]), "patch": rec["diff"] or "",
         "resolved": rec["resolved"], "reward": rec["reward"], "rollout_id": rec["rollout_id"],
         "meta": {"kind": rec["grade"].get("kind"), "harness": rec["harness"]}}
        for rec in records if rec["reward"] is not None
    ]  # fmt: skip
    _write_jsonl(out / "rerank_store.jsonl", store)
    return records


async def collect(
    args: argparse.Namespace, tasks: list[Task]
) -> tuple[list[SweRollout], dict[str, Any]]:
    """The rollouts, graded, and the evaluation report (no file is written here)."""
    prompts = {t.id: t.prompt for t in tasks}
    limits = Limits(
        max_steps=args.max_steps, max_seconds=args.max_seconds, max_tokens=args.max_tokens,
        command_timeout=args.command_timeout,
    )  # fmt: skip
    options = SweOptions(
        samples_per_task=args.samples, concurrency=args.concurrency,
        grade_concurrency=args.grade_concurrency, scheme=args.scheme,
        model_version=args.model_version,
    )  # fmt: skip
    total = len(tasks) * args.samples
    done = 0

    def progress(r: SweRollout) -> None:
        nonlocal done
        done += 1
        fault = r.result.fault or r.grade_fault
        print(f"[{done}/{total}] {r.result.task_id}#{r.sample} {r.result.status} "
              f"steps={r.result.steps} reward={r.reward}" + (f" fault={fault}" if fault else ""),
              flush=True)  # fmt: skip

    async with orchard.AsyncOrchard() as client:
        proxy_url = args.proxy or local_proxy_url(client.config.home)
        ca = str(client.config.home / "run" / "ca.pem") if proxy_url.startswith("https") else None
        harness = harness_of(args.harness, AgentConfig(), ca)
        async with ModelProxyClient(proxy_url, client.config.api_key, ca=ca) as proxy:
            try:
                rollouts = await run_swe(
                    client, harness, tasks, proxy=proxy, model=args.model, limits=limits,
                    options=options, on_graded=progress,
                    sandbox=SandboxOptions(template=args.template or None),
                )  # fmt: skip
            finally:
                close = getattr(harness, "aclose", None)
                if close is not None:
                    await close()
        ks = sorted({int(k) for k in args.k.split(",")})
        ranker = client.rewards.rank if args.rerank else None
        report = await evaluate([r.record() for r in rollouts], ks, ranker, prompts)
    return rollouts, report


def run(args: argparse.Namespace) -> int:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    tasks = load_tasks(args.tasks)
    if args.only:
        keep = set(args.only.split(","))
        tasks = [t for t in tasks if t.id in keep]
        if not tasks:
            raise SystemExit(f"--only {args.only}: no such instance in {args.tasks}")
    started = time.monotonic()
    rollouts, report = asyncio.run(collect(args, tasks))
    records = write_outputs(out, rollouts, {t.id: t.prompt for t in tasks})
    (out / "eval.json").write_text(json.dumps(report, indent=2) + "\n")
    text = table(report)
    (out / "eval.txt").write_text(text)
    hooks = post_run_hooks(out, records)
    summary = {
        "tasks": len(tasks), "rollouts": len(rollouts), "seconds": time.monotonic() - started,
        "statuses": {s: sum(1 for r in records if r["status"] == s)
                     for s in ("completed", "truncated", "aborted")},
        "grade_faults": sum(1 for r in records if r["grade_fault"]),
        "options": vars(args), "hooks": hooks,
    }  # fmt: skip
    (out / "run.json").write_text(json.dumps(summary, indent=2) + "\n")
    print(text, end="")
    print(f"wrote {out}")
    return 0


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m orchard.recipes.swe", description=__doc__.split("\n")[0]
    )
    sub = p.add_subparsers(dest="command", required=True)
    r = sub.add_parser("run", help="rollouts, grading, samples and evaluation over a task set")
    r.add_argument(
        "--tasks", default=str(SAMPLES), help="instances JSONL (default: the bundled set)"
    )
    r.add_argument("--only", default="", help="comma-separated instance ids to keep")
    r.add_argument("--out", required=True, help="output directory")
    r.add_argument("--samples", type=int, default=1, help="rollouts per task (N)")
    r.add_argument("--k", default="1", help="the k of pass@k, comma-separated")
    r.add_argument("--model", required=True, help="the model name sent to the proxy")
    r.add_argument("--model-version", default="", help="the policy version recorded")
    r.add_argument("--proxy", default="", help="model proxy URL (default: the local stack's)")
    r.add_argument("--harness", default="bash", help="bash (built-in) or MODULE:ATTR")
    r.add_argument("--concurrency", type=int, default=8)
    r.add_argument("--template", default="",
                   help="claim the rollouts' sandboxes from this template's warm pool")  # fmt: skip
    r.add_argument("--grade-concurrency", type=int, default=4)
    r.add_argument("--scheme", default="pm1", choices=("pm1", "binary", "pass_rate"))
    r.add_argument("--max-steps", type=int, default=50)
    r.add_argument("--max-seconds", type=float, default=1800.0)
    r.add_argument("--max-tokens", type=int, default=None)
    r.add_argument("--command-timeout", type=float, default=120.0)
    r.add_argument("--no-rerank", dest="rerank", action="store_false",
                   help="skip best-of-N (the rewards service needs a value model for it)")  # fmt: skip
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.samples < 1 or args.concurrency < 1:
        raise SystemExit("--samples and --concurrency must be at least 1")
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
