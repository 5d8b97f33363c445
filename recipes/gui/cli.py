"""``python -m orchard.recipes.gui``: run MiniWoB tasks with the VLM agent; filter WebGym rows.

::

    python -m orchard.recipes.gui run --out runs/g1 --model NAME --judge-url URL --judge-model M
        [--miniwob click-button,enter-text | --miniwob all] [--samples 2] [--max-steps 15]
        [--rounds 10 --batch 16 [--curriculum 15,30] [--weights all_fail=0.5,...]]
        [--keep-screenshots 3] [--concurrency 4] [--memory 768Mi] [--proxy URL] [--seed 0]
    python -m orchard.recipes.gui filter --tasks rows.jsonl --out DIR [--eval evalrows.jsonl ...]
        [--benchmark-sites webvoyager|SITE,...] [--ranks tranco.csv --max-rank 10000]
        [--max-per-site N] [--dedup-threshold 0.8 | --no-dedup]
    python -m orchard.recipes.gui agreement runs/g1/rollouts.jsonl

``run`` works against the stack of ``$ORCHARD_HOME`` (or ``ORCHARD_ENDPOINT`` /
``ORCHARD_API_KEY``) like the SWE recipe's: browser sandboxes through the SDK, the model
through the recording proxy (``--proxy``, default the URL ``orchard up`` wrote; the proxy's
``--model-upstream`` is the vision-language model), the judge at ``--judge-url`` (any
OpenAI-compatible endpoint that takes images; see :mod:`orchard.recipes.gui.judge` for why
not the rewards service). Without ``--rounds`` every task runs ``--samples`` times at
``--max-steps``; with it, each round draws ``--batch`` tasks by observed success
(:mod:`~orchard.recipes.gui.sampling`) at the curriculum's step budget
(:mod:`~orchard.recipes.gui.curriculum`). It writes into ``--out``:

- ``rollouts.jsonl``: one line per rollout (status, steps, reward and how it was reached,
  MiniWoB's ground truth, the transcript with screenshots as digests);
- ``rewards.jsonl``: rollout, task, status, reward, dropped (a judge failure), truth;
- ``samples.rl.jsonl``: every recorded training sample (reward on it; ``trainable`` false
  where a fault or a dropped judgement masks it); ``samples.sft.jsonl``: the trainable
  samples of rewarded successes (reward > 0), for rejection-sampling SFT;
- ``agreement.json``: the judge against MiniWoB's success signal (:mod:`~orchard.recipes.gui.agreement`);
- ``screenshots/<rollout>.png``: each rollout's last screenshot;
- ``rounds.jsonl`` and ``curriculum.json`` (with ``--rounds``); ``run.json``: options and counts.

``filter`` writes ``kept.jsonl`` (the kept rows as read) and ``filter_report.json`` (per stage:
in, out, reasons, each dropped task with its reason) and prints the table.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import re
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from orchard.recipes.swe.tasks import TaskRowError, read_rows

import orchard
from orchard.rollouts import Limits, ModelProxyClient, local_proxy_url

from . import filters as f
from .agent import GuiAgent, GuiAgentConfig
from .agreement import agreement, pairs_of
from .browser import browser_sandbox_options
from .curriculum import StepCurriculum
from .judge import ChatJudge
from .miniwob import SCRIPTED, TASKS
from .runner import GuiOptions, GuiRollout, RoundResult, run_gui, run_round
from .sampling import BUCKETS, SuccessSampler
from .tasks import GuiTask, load_tasks, miniwob_task

SAFE_NAME = re.compile(r"[^A-Za-z0-9._-]+")


def _write_jsonl(path: Path, rows: Sequence[Mapping[str, Any]]) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    with tmp.open("w") as out:
        for row in rows:
            out.write(json.dumps(row, ensure_ascii=False) + "\n")
    tmp.replace(path)


def miniwob_tasks(spec: str) -> list[GuiTask]:
    names = list(TASKS) if spec == "all" else [n.strip() for n in spec.split(",") if n.strip()]
    unknown = [n for n in names if n not in TASKS]
    if unknown or not names:
        raise SystemExit(f"--miniwob: unknown task(s) {unknown or spec!r} (see miniwob.TASKS)")
    return [miniwob_task(n) for n in names]


def weights_of(spec: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for part in filter(None, spec.split(",")):
        name, _, value = part.partition("=")
        if name not in BUCKETS:
            raise SystemExit(f"--weights: unknown bucket {name!r} (buckets: {', '.join(BUCKETS)})")
        try:
            out[name] = float(value)
        except ValueError:
            raise SystemExit(f"--weights: {part!r} is not bucket=number") from None
    return out


def write_outputs(out: Path, rollouts: Sequence[GuiRollout]) -> dict[str, Any]:
    """Every output file of a run; the agreement report."""
    records = [r.record() for r in rollouts]
    _write_jsonl(out / "rollouts.jsonl", records)
    _write_jsonl(
        out / "rewards.jsonl",
        [{k: rec[k] for k in ("rollout_id", "task_id", "status", "reward", "dropped",
                              "truth_success", "task_reward")} for rec in records],
    )  # fmt: skip
    rl: list[dict[str, Any]] = []
    sft: list[dict[str, Any]] = []
    for r in rollouts:
        for sample in r.result.samples:
            tagged = {**sample, "task_id": r.result.task_id, "rollout_id": r.rollout_id}
            rl.append(tagged)
            if r.reward is not None and r.reward > 0 and sample.get("trainable"):
                sft.append(tagged)
    _write_jsonl(out / "samples.rl.jsonl", rl)
    _write_jsonl(out / "samples.sft.jsonl", sft)
    shots = out / "screenshots"
    shots.mkdir(exist_ok=True)
    for r in rollouts:
        if r.screenshots:
            (shots / (SAFE_NAME.sub("_", r.rollout_id) + ".png")).write_bytes(r.screenshots[-1][1])
    pairs, skipped = pairs_of(records)
    report = agreement(pairs, skipped).as_dict()
    (out / "agreement.json").write_text(json.dumps(report, indent=2) + "\n")
    return report


async def collect(args: argparse.Namespace, tasks: list[GuiTask]) -> dict[str, Any]:
    limits = Limits(max_steps=args.max_steps, max_seconds=args.max_seconds)
    options = GuiOptions(
        samples_per_task=args.samples, concurrency=args.concurrency,
        model_version=args.model_version, seed_base=args.seed,
    )  # fmt: skip
    sandbox = browser_sandbox_options(memory=args.memory)
    if args.image:
        sandbox = dataclasses.replace(sandbox, image=args.image)
    config = GuiAgentConfig(keep_screenshots=args.keep_screenshots, transport=args.transport)
    done = 0

    def progress(r: GuiRollout) -> None:
        nonlocal done
        done += 1
        why = r.result.fault or ""
        print(f"[{done}] {r.rollout_id} {r.result.status} steps={r.result.steps} "
              f"reward={r.reward} truth={r.reward_detail.get('truth_success')}"
              + (f" fault={why}" if why else ""), flush=True)  # fmt: skip

    out: dict[str, Any] = {"rounds": None, "curriculum": None}
    judge = ChatJudge(args.judge_url, args.judge_model, api_key=args.judge_key)
    async with orchard.AsyncOrchard() as client:
        proxy_url = args.proxy or local_proxy_url(client.config.home)
        ca = str(client.config.home / "run" / "ca.pem") if proxy_url.startswith("https") else None
        agent = GuiAgent(config, ca=ca)
        async with ModelProxyClient(proxy_url, client.config.api_key, ca=ca) as proxy:
            try:
                if not args.rounds:
                    out["rollouts"] = await run_gui(
                        client, agent, tasks, proxy=proxy, model=args.model, judge=judge,
                        limits=limits, options=options, sandbox=sandbox, on_result=progress,
                    )  # fmt: skip
                else:
                    budgets = [int(b) for b in args.curriculum.split(",")]
                    curriculum = StepCurriculum(budgets=budgets, window=args.stable_window,
                                                tolerance=args.stable_tolerance)  # fmt: skip
                    sampler = SuccessSampler([t.id for t in tasks], weights=weights_of(args.weights),
                                             seed=args.seed or 0)  # fmt: skip
                    by_id = {t.id: t for t in tasks}
                    rounds: list[RoundResult] = []
                    for number in range(args.rounds):
                        rounds.append(await run_round(
                            number, client, agent, by_id, sampler=sampler, curriculum=curriculum,
                            batch=args.batch, proxy=proxy, model=args.model, judge=judge,
                            limits=limits, options=options, sandbox=sandbox, on_result=progress,
                        ))  # fmt: skip
                        print(f"round {number}: budget {rounds[-1].budget}, "
                              f"{rounds[-1].successes}/{rounds[-1].graded} succeeded", flush=True)  # fmt: skip
                    out["rollouts"] = [r for rd in rounds for r in rd.rollouts]
                    out["rounds"] = [rd.as_dict() for rd in rounds]
                    out["curriculum"] = {
                        "curriculum": curriculum.state(),
                        "sampler": sampler.state(),
                    }
            finally:
                await agent.aclose()
                await judge.aclose()
    return out


def run(args: argparse.Namespace) -> int:
    if not args.judge_url or not args.judge_model:
        raise SystemExit("run: --judge-url and --judge-model are required (the reward's judge)")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    tasks = miniwob_tasks(args.miniwob)
    started = time.monotonic()
    result = asyncio.run(collect(args, tasks))
    rollouts: list[GuiRollout] = result["rollouts"]
    report = write_outputs(out, rollouts)
    if result["rounds"] is not None:
        _write_jsonl(out / "rounds.jsonl", result["rounds"])
        (out / "curriculum.json").write_text(json.dumps(result["curriculum"], indent=2) + "\n")
    records = [r.record() for r in rollouts]
    summary = {
        "tasks": len(tasks), "rollouts": len(rollouts), "seconds": time.monotonic() - started,
        "statuses": {s: sum(1 for r in records if r["status"] == s)
                     for s in ("completed", "truncated", "aborted")},
        "dropped": sum(1 for r in records if r["dropped"]),
        "rewards": {str(k): sum(1 for r in records if r["reward"] == k) for k in (1.0, 0.0, -1.0)},
        "agreement": {k: report[k] for k in ("n", "agreement", "kappa")},
        "options": vars(args),
    }  # fmt: skip
    (out / "run.json").write_text(json.dumps(summary, indent=2) + "\n")
    print(json.dumps({k: summary[k] for k in ("rollouts", "statuses", "dropped", "rewards",
                                               "agreement")}))  # fmt: skip
    print(f"wrote {out}")
    return 0


def filter_command(args: argparse.Namespace) -> int:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    try:
        tasks = load_tasks(args.tasks)
        eval_tasks = [t for path in args.eval for t in load_tasks(path)]
    except (TaskRowError, OSError) as err:
        raise SystemExit(f"filter: {err}") from None
    stages: list[f.Stage] = [f.EvalOverlap(eval_tasks), f.Subordinates(eval_tasks)]
    if args.benchmark_sites != "none":
        sites = (
            f.WEBVOYAGER_SITES
            if args.benchmark_sites == "webvoyager"
            else args.benchmark_sites.split(",")
        )
        stages.append(f.BenchmarkSites(sites))
    if args.ranks:
        ranks = f.read_ranks(Path(args.ranks).read_text().splitlines())
        stages.append(f.SitePopularity(ranks, args.max_rank, args.max_per_site))
    if not args.no_dedup:
        from .embeddings import MiniLM

        stages.append(f.SemanticDedup(MiniLM(), args.dedup_threshold))
    report = f.run_filters(tasks, stages)
    kept = {t.id for t in report.kept}
    rows = [raw for _, raw in read_rows(args.tasks) if str(raw.get("task_id")) in kept]
    _write_jsonl(out / "kept.jsonl", rows)
    (out / "filter_report.json").write_text(json.dumps(report.as_dict(), indent=2) + "\n")
    print(report.table(), end="")
    print(f"wrote {out}")
    return 0


def agreement_command(args: argparse.Namespace) -> int:
    records = [
        json.loads(line) for line in Path(args.rollouts).read_text().splitlines() if line.strip()
    ]
    pairs, skipped = pairs_of(records)
    print(json.dumps(agreement(pairs, skipped).as_dict(), indent=2))
    return 0


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m orchard.recipes.gui", description=__doc__.split("\n")[0]
    )
    sub = p.add_subparsers(dest="command", required=True)
    r = sub.add_parser("run", help="MiniWoB rollouts with the VLM agent, judged, samples exported")
    r.add_argument("--out", required=True, help="output directory")
    r.add_argument("--model", required=True, help="the model name sent to the proxy")
    r.add_argument(
        "--judge-url", default="", help="the judge's OpenAI-compatible base URL (.../v1)"
    )
    r.add_argument("--judge-model", default="", help="the judge's model name")
    r.add_argument("--judge-key", default="", help="the judge's API key (if it needs one)")
    r.add_argument(
        "--miniwob", default=",".join(SCRIPTED), help="comma-separated task names, or all"
    )
    r.add_argument("--samples", type=int, default=1, help="rollouts per task (without --rounds)")
    r.add_argument("--rounds", type=int, default=0, help="training rounds (sampler + curriculum)")
    r.add_argument("--batch", type=int, default=8, help="rollouts per round")
    r.add_argument("--curriculum", default="15,30", help="the step budgets, in order")
    r.add_argument("--stable-window", type=int, default=3, help="rounds that must agree")
    r.add_argument("--stable-tolerance", type=float, default=0.05, help="their max - min")
    r.add_argument(
        "--weights",
        default="",
        help="bucket=weight,... (all_fail, low, mid, high, all_success, unseen)",
    )
    r.add_argument("--max-steps", type=int, default=15, help="step budget (without --rounds)")
    r.add_argument("--max-seconds", type=float, default=900.0)
    r.add_argument("--keep-screenshots", type=int, default=3, help="k: screenshots in context")
    r.add_argument("--transport", default="port", choices=("port", "exec"))
    r.add_argument("--memory", default="768Mi", help="each browser sandbox's memory cap")
    r.add_argument("--image", default="", help="the browser image (default: image.image_name())")
    r.add_argument("--concurrency", type=int, default=4)
    r.add_argument("--seed", type=int, default=0, help="MiniWoB seeds start here")
    r.add_argument("--model-version", default="", help="the policy version recorded")
    r.add_argument("--proxy", default="", help="model proxy URL (default: the local stack's)")
    fl = sub.add_parser("filter", help="the five-stage filter over WebGym-style task rows")
    fl.add_argument("--tasks", required=True, help="a .jsonl/.json/.parquet of WebGym rows")
    fl.add_argument(
        "--eval", action="append", default=[], help="an evaluation set's rows (repeatable)"
    )
    fl.add_argument("--benchmark-sites", default="webvoyager", help="webvoyager, none, or SITE,...")
    fl.add_argument("--ranks", default="", help="a site ranking (rank,site lines); none: stage off")
    fl.add_argument("--max-rank", type=int, default=10_000)
    fl.add_argument("--max-per-site", type=int, default=None)
    fl.add_argument("--dedup-threshold", type=float, default=0.8)
    fl.add_argument("--no-dedup", action="store_true", help="skip the embedding stage")
    fl.add_argument("--out", required=True, help="output directory")
    a = sub.add_parser("agreement", help="the judge-agreement report of a run's rollouts.jsonl")
    a.add_argument("rollouts")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.command == "filter":
        return filter_command(args)
    if args.command == "agreement":
        return agreement_command(args)
    if args.samples < 1 or args.concurrency < 1 or args.batch < 1 or args.rounds < 0:
        raise SystemExit("--samples, --concurrency and --batch must be at least 1, --rounds >= 0")
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
