"""``python -m orchard.recipes.swe run``: the recipe end to end over a task set.

::

    python -m orchard.recipes.swe run --out runs/r1 --model NAME
        [--tasks FILE ...] [--format orchard] [--test-cmd CMD] [--only ID,...] [--pull-images]
        [--sampler fixed --samples 4 | --sampler bar --bar-n 4 --bar-max 8 --bar-stride 4
         --bar-band 0.25,0.75] [--casft-teacher MODEL] [--k 1,2,4] [--proxy URL]
        [--harness bash|codex|claude-code|openclaw|mini-swe-agent|aider|MODULE:ATTR]
        [--memory 2Gi] [--concurrency 8] [--template NAME] [--max-steps 50] ...

Against the stack of ``$ORCHARD_HOME`` (or ``ORCHARD_ENDPOINT`` / ``ORCHARD_API_KEY``): the
sandboxes and the rewards service through the SDK, the model through the recording proxy
(``--proxy``, default the URL ``orchard up`` wrote to ``<home>/run/modelproxy.addr``; the proxy's
``--model-upstream`` is the inference server). The pipeline, in order:

1. the tasks are read with :func:`orchard.recipes.swe.tasks.load_tasks` (``--format``; default
   the bundled sample and the ten bundled bugs ``make swe-tasks`` builds), every row validated;
2. every image they name is checked present (:func:`orchard.recipes.swe.images.ensure_images`,
   ``--pull-images`` pulls the missing ones) before any rollout, one error naming each missing;
3. the rollouts: ``--sampler fixed`` runs ``--samples`` per task; ``--sampler bar`` draws each
   task's rollouts with Balanced Adaptive Rollout (:func:`orchard.recipes.swe.bar.sample_group`);
   every rollout is graded by the rewards service as it ends;
4. credit-assignment SFT data from the failed rollouts when ``--casft-teacher`` is given;
5. the evaluation.

It writes into ``--out``:

- ``rollouts.jsonl``: one line per rollout (status, steps, diff, transcript, grade, reward);
- ``rewards.jsonl``: the rewards alone (task, rollout, status, reward, resolved, kind);
- ``bar_groups.jsonl`` (``--sampler bar``): per task, the chosen rollouts or the drop reason;
- ``samples.rl.jsonl``: every recorded training sample of every rollout (the proxy's samples,
  reward spread on them; ``trainable`` false where a fault masks them); with ``--sampler bar``
  only the kept groups' samples, each tagged with its ``group``;
- ``samples.sft.jsonl``: the trainable samples of resolved rollouts (rejection sampling);
- ``casft.sft.jsonl`` (``--casft-teacher``): credit-assignment SFT records of failed rollouts;
- ``rerank_store.jsonl``: the graded rollouts in the reranker's store format
  (``python -m orchard.rewards.rerank train`` trains the value model on it);
- ``eval.json`` / ``eval.txt``: pass@1, pass@k, best-of-N with the reranker;
- ``run.json``: the options, the counts, and per optional output what was written or why not.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import importlib
import json
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, cast

import orchard
from orchard.rollouts import (
    Harness,
    Limits,
    ModelProxyClient,
    SandboxOptions,
    Task,
    local_proxy_url,
)
from orchard.rollouts.harnesses import HARNESSES

from . import bar, casft
from .agent import AgentConfig, BashAgent
from .bundled import instances_path
from .evaluate import compact_trajectory, evaluate, table
from .images import MissingImagesError, ensure_images
from .runner import SweDraw, SweOptions, SweRollout, rollout_tasks, run_swe
from .tasks import FORMATS, SweTask, TaskNotGradable, TaskRowError, load_tasks

SAMPLES = Path(__file__).parent / "samples" / "instances.jsonl"
"""The calc_divide sample (in the package)."""


SUCCESS_ABOVE = {"pm1": 0.0, "binary": 0.0, "pass_rate": 0.999}
"""Per reward scheme, the reward a resolved rollout is above (BAR's and CA-SFT's threshold):
pm1 +1 vs -1, binary 1 vs 0, pass_rate 1.0 only when every test passes."""


def default_task_files() -> list[Path]:
    """The bundled set: the calc_divide sample and the ten real bugs of ``make swe-tasks``."""
    bundled = instances_path()
    if not bundled.is_file():
        raise SystemExit(
            f"the bundled tasks are not built ({bundled} is missing): run `make swe-tasks` "
            "(or pass --tasks FILE)"
        )
    return [SAMPLES, bundled]


def harness_of(spec: str, config: AgentConfig, ca: str | None = None) -> Harness:
    """``bash`` (the built-in loop), the name of a real harness of the tools layer
    (``orchard.rollouts.harnesses.HARNESSES``: codex, claude-code, openclaw, mini-swe-agent,
    aider; its sandboxes get the tools layer and the model endpoint), or ``MODULE:ATTR``: a
    Harness, or a class or callable making one."""
    if spec == "bash":
        return BashAgent(config, ca=ca)
    if spec in HARNESSES:
        # a CliHarness's name is a ClassVar, which mypy does not match to the Protocol's field
        return cast(Harness, HARNESSES[spec]())
    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        names = ", ".join(["bash", *sorted(HARNESSES)])
        raise SystemExit(f"--harness: one of {names}, or MODULE:ATTR, not {spec!r}")
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


def _write_jsonl(path: Path, rows: Sequence[Mapping[str, Any]]) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    with tmp.open("w") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
    tmp.replace(path)


def read_tasks(args: argparse.Namespace) -> list[SweTask]:
    """Every ``--tasks`` file through the loaders (ids unique across files), ``--only`` applied."""
    if args.tasks:
        files = [(Path(f), args.format) for f in args.tasks]
    else:
        files = [(f, "orchard") for f in default_task_files()]
    tasks: list[SweTask] = []
    seen: dict[str, Path] = {}
    for path, fmt in files:
        try:
            loaded = load_tasks(path, fmt, test_cmd=args.test_cmd or None)
        except (TaskRowError, OSError) as err:
            raise SystemExit(f"--tasks {path}: {err}") from None
        for task in loaded:
            if task.instance_id in seen:
                raise SystemExit(
                    f"--tasks: {task.instance_id!r} is in both {seen[task.instance_id]} and {path}"
                )
            seen[task.instance_id] = path
            tasks.append(task)
    if args.only:
        keep = set(args.only.split(","))
        unknown = keep - set(seen)
        if unknown:
            raise SystemExit(f"--only: no such task: {', '.join(sorted(unknown))}")
        tasks = [t for t in tasks if t.instance_id in keep]
    return tasks


def check_images(tasks: Sequence[SweTask], pull: bool) -> list[SweTask]:
    """The tasks with their images renamed to the names the service stores them under; every
    missing image named in one error before any rollout starts."""
    try:
        with orchard.Orchard() as client:
            plan = ensure_images([t.image for t in tasks], client, pull=pull)
    except MissingImagesError as err:
        raise SystemExit(f"{err}\n(`orchard image pull REF` each, or pass --pull-images)") from None
    return [dataclasses.replace(t, image=plan.names[t.image]) for t in tasks]


def write_outputs(
    out: Path,
    rollouts: Sequence[SweRollout],
    prompts: dict[str, str],
    groups: Mapping[str, str] | None = None,
) -> list[dict[str, Any]]:
    """``groups``: rollout id -> its BAR group (the task id) for the rollouts of kept groups;
    None (the fixed sampler): every rollout's samples are RL samples."""
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
            if groups is None:
                rl.append(tagged)
            elif rec["rollout_id"] in groups:
                rl.append({**tagged, "group": groups[rec["rollout_id"]]})
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


def bar_config(args: argparse.Namespace) -> bar.BarConfig:
    try:
        pmin, pmax = (float(x) for x in args.bar_band.split(","))
        return bar.BarConfig(
            group_size=args.bar_n, max_rollouts=args.bar_max, stride=args.bar_stride,
            pmin=pmin, pmax=pmax, success_threshold=SUCCESS_ABOVE[args.scheme],
        )  # fmt: skip
    except ValueError as err:
        raise SystemExit(f"--bar-*: {err}") from None


def group_record(group: bar.GroupResult, by_result: Mapping[int, SweRollout]) -> dict[str, Any]:
    """One ``bar_groups.jsonl`` line: the chosen rollouts (ids) or why none was kept."""

    def rid(result: Any) -> str | None:
        rollout = by_result.get(id(result))
        return None if rollout is None else f"{rollout.result.task_id}#{rollout.sample}"

    return {
        "task_id": group.task_id, "kept": group.kept, "reason": group.reason,
        "group": [rid(r) for r in group.group],
        "group_rewards": [r.reward for r in group.group],
        "drawn": [rid(r) for r in group.drawn],
        "outcomes": [r.detail.get("bar_outcome") for r in group.drawn],
        "spent": group.spent, "strides": group.strides, "errors": group.errors,
    }  # fmt: skip


class Teacher:
    """The rewards service's judge as the CA-SFT teacher, holding it to the model asked for:
    the judge's model is the service's (``ORCHARD_JUDGE_MODEL``), so a verdict from another
    model is refused (no verdict, the reason said) rather than trained on."""

    def __init__(self, rewards: casft.JudgeClient, model: str) -> None:
        self.rewards, self.model = rewards, model

    async def judge(self, template: str, inputs: Mapping[str, str]) -> orchard.JudgeVerdict:
        verdict = await self.rewards.judge(template, inputs)
        if verdict.ok and verdict.model != self.model:
            return dataclasses.replace(
                verdict, ok=False,
                failure=f"the judge answered with model {verdict.model!r}, not the teacher "
                f"{self.model!r} (the rewards service's ORCHARD_JUDGE_MODEL)",
            )  # fmt: skip
        return verdict


async def collect(args: argparse.Namespace, tasks: list[Task]) -> dict[str, Any]:
    """The rollouts, graded, their BAR groups, CA-SFT records and the evaluation report."""
    limits = Limits(
        max_steps=args.max_steps, max_seconds=args.max_seconds, max_tokens=args.max_tokens,
        command_timeout=args.command_timeout,
    )  # fmt: skip
    options = SweOptions(
        samples_per_task=args.samples, concurrency=args.concurrency,
        grade_concurrency=args.grade_concurrency, scheme=args.scheme,
        model_version=args.model_version,
    )  # fmt: skip
    done = 0

    def progress(r: SweRollout) -> None:
        nonlocal done
        done += 1
        fault = r.result.fault or r.grade_fault
        print(f"[{done}] {r.result.task_id}#{r.sample} {r.result.status} "
              f"steps={r.result.steps} reward={r.reward}" + (f" fault={fault}" if fault else ""),
              flush=True)  # fmt: skip

    out: dict[str, Any] = {"groups": None, "casft": None}
    async with orchard.AsyncOrchard() as client:
        proxy_url = args.proxy or local_proxy_url(client.config.home)
        ca = str(client.config.home / "run" / "ca.pem") if proxy_url.startswith("https") else None
        harness = harness_of(args.harness, AgentConfig(), ca)
        sandbox = SandboxOptions(template=args.template or None, memory=args.memory or None)
        async with ModelProxyClient(proxy_url, client.config.api_key, ca=ca) as proxy:
            try:
                if args.sampler == "fixed":
                    rollouts = await run_swe(
                        client, harness, tasks, proxy=proxy, model=args.model, limits=limits,
                        options=options, on_graded=progress, sandbox=sandbox,
                    )  # fmt: skip
                else:
                    draw = SweDraw(client, harness, proxy=proxy, model=args.model,
                                   limits=limits, options=options, sandbox=sandbox)  # fmt: skip
                    sampler = bar_config(args)
                    groups = await asyncio.gather(
                        *(bar.sample_group(t, draw, sampler) for t in tasks)
                    )
                    rollouts = list(draw.drawn)
                    for r in rollouts:
                        progress(r)
                    by_result = {id(r.result): r for r in rollouts}
                    out["groups"] = [group_record(g, by_result) for g in groups]
            finally:
                close = getattr(harness, "aclose", None)
                if close is not None:
                    await close()
        out["rollouts"] = rollouts
        if args.casft_teacher:
            prompts = {t.id: t.prompt for t in tasks}
            items = [
                (r.result.task_id, prompts[r.result.task_id], sample)
                for r in rollouts if r.reward is not None and not r.resolved
                for sample in r.result.samples
            ]  # fmt: skip
            config = casft.CreditConfig(success_threshold=SUCCESS_ABOVE[args.scheme])
            teacher = Teacher(client.rewards, args.casft_teacher)
            out["casft"] = await casft.build(items, teacher, config)
        ks = sorted({int(k) for k in args.k.split(",")})
        ranker = client.rewards.rank if args.rerank else None
        prompts = {t.id: t.prompt for t in tasks}
        out["report"] = await evaluate([r.record() for r in rollouts], ks, ranker, prompts)
    return out


def run(args: argparse.Namespace) -> int:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    swe_tasks = check_images(read_tasks(args), args.pull_images)
    try:
        tasks = rollout_tasks(swe_tasks)
    except TaskNotGradable as err:
        raise SystemExit(f"{err}") from None
    started = time.monotonic()
    result = asyncio.run(collect(args, tasks))
    rollouts: list[SweRollout] = result["rollouts"]
    outputs: dict[str, Any] = {}
    groups: dict[str, str] | None = None
    if result["groups"] is not None:
        _write_jsonl(out / "bar_groups.jsonl", result["groups"])
        groups = {rid: g["task_id"] for g in result["groups"] if g["kept"]
                  for rid in g["group"] if rid is not None}  # fmt: skip
        outputs["bar_groups.jsonl"] = {
            "kept": sum(1 for g in result["groups"] if g["kept"]),
            "dropped": sum(1 for g in result["groups"] if not g["kept"]),
        }
    else:
        outputs["bar_groups.jsonl"] = "not written: --sampler fixed (no groups are chosen)"
    records = write_outputs(out, rollouts, {t.id: t.prompt for t in tasks}, groups)
    built: casft.Outcome | None = result["casft"]
    if built is not None:
        casft.write_jsonl(built.records, out / "casft.sft.jsonl")
        outputs["casft.sft.jsonl"] = {
            "teacher": args.casft_teacher,
            "counts": built.counts(),
            "skipped": [dataclasses.asdict(s) for s in built.skipped],
        }
    else:
        outputs["casft.sft.jsonl"] = "not written: no --casft-teacher (a teacher model is needed)"
    report = result["report"]
    (out / "eval.json").write_text(json.dumps(report, indent=2) + "\n")
    text = table(report)
    (out / "eval.txt").write_text(text)
    summary = {
        "tasks": len(tasks), "rollouts": len(rollouts), "seconds": time.monotonic() - started,
        "statuses": {s: sum(1 for r in records if r["status"] == s)
                     for s in ("completed", "truncated", "aborted")},
        "grade_faults": sum(1 for r in records if r["grade_fault"]),
        "images": sorted({str(t.image) for t in tasks}),
        "options": vars(args), "outputs": outputs,
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
    r.add_argument("--tasks", action="append", default=[],
                   help="a task file (.jsonl/.json/.parquet; repeatable; default: the bundled "
                   "sample and the ten bugs of `make swe-tasks`)")  # fmt: skip
    r.add_argument("--format", default="orchard", choices=sorted(FORMATS),
                   help="the row format of the --tasks files")  # fmt: skip
    r.add_argument("--test-cmd", default="",
                   help="test command template for formats whose rows carry none "
                   "({test_files}: the test patch's files)")  # fmt: skip
    r.add_argument("--pull-images", action="store_true",
                   help="pull missing images (orchard image pull) instead of failing")  # fmt: skip
    r.add_argument("--only", default="", help="comma-separated instance ids to keep")
    r.add_argument("--out", required=True, help="output directory")
    r.add_argument("--sampler", default="fixed", choices=("fixed", "bar"),
                   help="fixed: --samples per task; bar: Balanced Adaptive Rollout")  # fmt: skip
    r.add_argument("--samples", type=int, default=1, help="rollouts per task (fixed sampler)")
    r.add_argument("--bar-n", type=int, default=4, help="BAR group size")
    r.add_argument("--bar-max", type=int, default=8, help="BAR maximum rollouts per task")
    r.add_argument("--bar-stride", type=int, default=8, help="BAR rollouts drawn per stride")
    r.add_argument("--bar-band", default="0.25,0.75", help="BAR band pmin,pmax")
    r.add_argument("--casft-teacher", default="",
                   help="the rewards service judge's model: write casft.sft.jsonl")  # fmt: skip
    r.add_argument("--k", default="1", help="the k of pass@k, comma-separated")
    r.add_argument("--model", required=True, help="the model name sent to the proxy")
    r.add_argument("--model-version", default="", help="the policy version recorded")
    r.add_argument("--proxy", default="", help="model proxy URL (default: the local stack's)")
    r.add_argument("--harness", default="bash",
                   help="bash (built-in), a tools-layer harness (" + ", ".join(sorted(HARNESSES))
                   + ") or MODULE:ATTR")  # fmt: skip
    r.add_argument("--memory", default="",
                   help="each rollout sandbox's memory cap (e.g. 2Gi; the server's default if "
                   "unset); the Node.js harnesses want about 2Gi")  # fmt: skip
    r.add_argument("--concurrency", type=int, default=8)
    r.add_argument("--template", default="",
                   help="claim the rollouts' sandboxes from this template's warm pool")  # fmt: skip
    r.add_argument("--grade-concurrency", type=int, default=4)
    r.add_argument("--scheme", default="pm1", choices=tuple(SUCCESS_ABOVE))
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
