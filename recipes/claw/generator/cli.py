"""``python -m orchard.recipes.claw.generator``: make Claw tasks with a model, keep the valid ones.

::

    python -m orchard.recipes.claw.generator --out DIR --category NAME --model NAME
        [--solver-model NAME] [--ideas 3] [--proposals 1] [--build-attempts 3]
        [--revise-rounds 2] [--solve-trials 1] [--existing PATH ...] [--proxy URL]
        [--concurrency 2] [--max-steps 30] [--max-seconds 600] [--temperature T]

Against the stack of ``$ORCHARD_HOME`` (or ``ORCHARD_ENDPOINT`` / ``ORCHARD_API_KEY``): the
sandboxes through the SDK, every model call (generation and the solve stage's ReAct loop)
through the recording proxy (``--proxy``, default the URL ``orchard up`` wrote; its
``--model-upstream`` is the inference server). ``--model`` writes the tasks, ``--solver-model``
(default: the same) attempts the kept ones.

Existing task ids (never proposed again) are those of ``--existing`` files or folders (any
the recipe's loader reads) and of the tasks already in ``DIR/tasks``: running the command
again on the same ``DIR`` adds to its task set. Writes ``DIR/tasks/<id>.json`` (the kept
tasks, loadable by the recipe's runner as they are), ``DIR/manifest.jsonl`` (every idea, kept
or rejected, with its reason, attempts, trials and cost; appended to by a later run) and
``DIR/summary.json``; prints the summary. Exit 0 when the run completed (whatever was kept),
2 for a usage error.
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
from orchard.rollouts import Limits, ModelProxyClient, local_proxy_url

from . import prompts
from .claw import ClawBackend
from .loop import GeneratorOptions, Report, generate
from .manifest import write_report
from .model import GenerationModel
from .taskformat import existing_ids


def options_of(args: argparse.Namespace) -> GeneratorOptions:
    try:
        return GeneratorOptions(
            category=args.category, ideas=args.ideas, proposals=args.proposals,
            build_attempts=args.build_attempts, revise_rounds=args.revise_rounds,
            solve_trials=args.solve_trials, concurrency=args.concurrency,
        )  # fmt: skip
    except ValueError as err:
        raise SystemExit(f"error: {err}") from None


async def run(args: argparse.Namespace, options: GeneratorOptions, existing: set[str]) -> Report:
    limits = Limits(max_steps=args.max_steps, max_seconds=args.max_seconds)
    sampling: dict[str, Any] = {}
    if args.temperature is not None:
        sampling["temperature"] = args.temperature
    async with orchard.AsyncOrchard() as client:
        proxy_url = args.proxy or local_proxy_url(client.config.home)
        ca = str(client.config.home / "run" / "ca.pem") if proxy_url.startswith("https") else None
        async with ModelProxyClient(proxy_url, client.config.api_key, ca=ca) as proxy:
            backend = ClawBackend(client, proxy, solver_model=args.solver_model or args.model,
                                  limits=limits, ca=ca)  # fmt: skip
            model = GenerationModel(
                proxy, args.model, sampling=sampling, model_version=args.model_version,
                system_prompts={
                    **prompts.SYSTEM_PROMPTS,
                    "build": prompts.BUILD_SYSTEM.format(
                        format_reference=backend.format_reference()),
                    "revise": prompts.BUILD_SYSTEM.format(
                        format_reference=backend.format_reference()),
                },
            )  # fmt: skip
            try:
                return await generate(model, backend, options, existing)
            finally:
                await model.aclose()
                await backend.aclose()


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    options = options_of(args)
    out = Path(args.out)
    existing = existing_ids(
        [*args.existing, *([out / "tasks"] if (out / "tasks").is_dir() else [])]
    )
    report = asyncio.run(run(args, options, existing))
    summary = write_report(report, out, {k: v for k, v in vars(args).items() if k != "existing"}
                           | {"existing": [str(p) for p in args.existing],
                              "existing_ids": len(existing)})  # fmt: skip
    print(json.dumps({k: summary[k] for k in ("ideas", "kept", "reasons")}))
    for outcome in report.outcomes:
        cost = outcome.cost.as_dict()
        print(f"{outcome.id}: {outcome.reason} tokens={cost['prompt_tokens']}+"
              f"{cost['completion_tokens']} calls={cost['model_calls']} "
              f"sandbox_s={cost['sandbox_seconds']}"
              + (f" solve={outcome.solve_score}" if outcome.kept else ""))  # fmt: skip
    print(f"wrote {out}")
    return 0


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m orchard.recipes.claw.generator",
                                description=__doc__.split("\n")[0])  # fmt: skip
    p.add_argument("--out", required=True, help="output folder (tasks/, manifest.jsonl, ...)")
    p.add_argument("--category", required=True, help="the category of the tasks to make")
    p.add_argument("--model", required=True, help="the model that writes the tasks")
    p.add_argument("--solver-model", default="", help="the model that solves (default --model)")
    p.add_argument("--model-version", default="", help="the policy version recorded")
    p.add_argument("--ideas", type=int, default=3, help="ideas asked for per proposal")
    p.add_argument("--proposals", type=int, default=1, help="proposals made in turn")
    p.add_argument("--build-attempts", type=int, default=3,
                   help="replies per build or revise (the first and its repairs)")  # fmt: skip
    p.add_argument("--revise-rounds", type=int, default=2,
                   help="revisions after a failed validation, at most")  # fmt: skip
    p.add_argument("--solve-trials", type=int, default=1, help="ReAct attempts per kept task")
    p.add_argument("--existing", action="append", default=[], type=Path,
                   help="a task file or folder whose ids are taken (repeatable)")  # fmt: skip
    p.add_argument("--proxy", default="", help="model proxy URL (default: the local stack's)")
    p.add_argument("--concurrency", type=int, default=2, help="ideas developed at once")
    p.add_argument("--max-steps", type=int, default=30, help="the solve stage's step limit")
    p.add_argument("--max-seconds", type=float, default=600.0,
                   help="the solve stage's wall-time limit per trial")  # fmt: skip
    p.add_argument("--temperature", type=float, default=None,
                   help="sampling temperature of the generation calls")  # fmt: skip
    return p


if __name__ == "__main__":
    sys.exit(main())
