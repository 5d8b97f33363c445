"""``python -m orchard.rewards.rerank``: train, evaluate, rank, or fine-tune from a trajectory store.

    python -m orchard.rewards.rerank evaluate STORE.jsonl [--featurizer hashing|minilm]
    python -m orchard.rewards.rerank evaluate --synthetic        # generated rollouts
    python -m orchard.rewards.rerank evaluate --synthetic --finetune-base DIR [--max-steps N]
    python -m orchard.rewards.rerank train STORE.jsonl --out model.npz
    python -m orchard.rewards.rerank rank model.npz|DIR CANDIDATES.jsonl
    python -m orchard.rewards.rerank finetune STORE.jsonl --base DIR --out DIR   (GPU advised)

``evaluate`` splits by task, trains on the rest (the numpy model, or with
``--finetune-base`` a fine-tuned HF checkpoint), and prints one JSON line:
best-of-N vs random vs oracle resolved rate on the held-out tasks, and AUC.
``rank`` takes a ``.npz`` value model or a folder written by ``finetune``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from .evaluation import Scorer, evaluate, split_by_task, train_and_evaluate
from .features import make_featurizer
from .model import ValueModel
from .store import Rollout, TrajectoryStore
from .synthetic import generate


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m orchard.rewards.rerank", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    commands = parser.add_subparsers(dest="command", required=True)
    ev = commands.add_parser("evaluate")
    ev.add_argument("store", nargs="?", type=Path)
    ev.add_argument("--synthetic", action="store_true", help="use generated rollouts")
    ev.add_argument("--featurizer", default="hashing")
    ev.add_argument("--seed", type=int, default=0)
    ev.add_argument("--finetune-base", help="local HF checkpoint: fine-tune it instead")
    ev.add_argument("--max-steps", type=int, default=None, help="fine-tuning steps at most")
    ev.add_argument("--out", type=Path, default=None, help="where the fine-tuned model goes")
    tr = commands.add_parser("train")
    tr.add_argument("store", type=Path)
    tr.add_argument("--out", type=Path, required=True)
    tr.add_argument("--featurizer", default="hashing")
    rk = commands.add_parser("rank")
    rk.add_argument("model", type=Path)
    rk.add_argument("candidates", type=Path, help="JSONL rollouts (resolved may be false/unknown)")
    ft = commands.add_parser("finetune")
    ft.add_argument("store", type=Path)
    ft.add_argument("--base", required=True, help="local HF checkpoint folder")
    ft.add_argument("--out", type=Path, required=True)
    ft.add_argument("--epochs", type=int, default=1)
    ft.add_argument("--max-steps", type=int, default=None)
    ft.add_argument("--max-length", type=int, default=2048, help="capped by the model's window")
    args = parser.parse_args(argv)

    if args.command == "evaluate":
        if args.synthetic == (args.store is not None):
            parser.error("give a STORE or --synthetic (one of them)")
        rollouts = (
            generate(seed=args.seed) if args.synthetic else TrajectoryStore(args.store).load()
        )
        if args.finetune_base:
            print(json.dumps(_evaluate_finetuned(rollouts, args)))
            return 0
        _model, report = train_and_evaluate(
            rollouts, make_featurizer(args.featurizer), seed=args.seed
        )
        print(json.dumps({"featurizer": args.featurizer, **report.to_dict()}))
    elif args.command == "train":
        model = ValueModel.train(
            TrajectoryStore(args.store).load(), make_featurizer(args.featurizer)
        )
        model.save(args.out)
        print(json.dumps({"saved": str(args.out)}))
    elif args.command == "rank":
        scorer = _load_scorer(args.model)
        candidates = TrajectoryStore(args.candidates).load()
        for index, score in scorer.rank(candidates):
            print(
                json.dumps({"rollout_id": candidates[index].rollout_id, "score": round(score, 4)})
            )
    else:
        from .hf_finetune import finetune

        summary = finetune(
            TrajectoryStore(args.store).load(), args.base, args.out, epochs=args.epochs,
            max_steps=args.max_steps, max_length=args.max_length,
        )  # fmt: skip
        print(json.dumps(summary))
    return 0


def _load_scorer(path: Path) -> Scorer:
    if path.is_dir():
        from .hf_finetune import FinetunedValueModel

        return FinetunedValueModel.load(path)
    return ValueModel.load(path)


def _evaluate_finetuned(rollouts: list[Rollout], args: argparse.Namespace) -> dict[str, object]:
    """The held-out evaluation of the fine-tuning path: train split -> checkpoint -> scores."""
    import tempfile

    from .hf_finetune import FinetunedValueModel, finetune

    train, held = split_by_task(rollouts, seed=args.seed)
    with tempfile.TemporaryDirectory() as scratch:
        out = args.out or Path(scratch) / "value_model"
        started = time.monotonic()
        summary = finetune(train, args.finetune_base, out, max_steps=args.max_steps,
                           seed=args.seed)  # fmt: skip
        trained = time.monotonic() - started
        report = evaluate(FinetunedValueModel.load(out), held)
    return {
        "model": "finetuned", "base": str(args.finetune_base), "steps": summary["steps"],
        "first_loss": round(summary["first_loss"], 4), "last_loss": round(summary["last_loss"], 4),
        "train_seconds": round(trained, 1), **report.to_dict(),
    }  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())
