"""``python -m orchard.rewards.rerank``: train, evaluate, rank, or fine-tune from a trajectory store.

    python -m orchard.rewards.rerank evaluate STORE.jsonl [--featurizer hashing|minilm]
    python -m orchard.rewards.rerank evaluate --synthetic        # generated rollouts
    python -m orchard.rewards.rerank train STORE.jsonl --out model.npz
    python -m orchard.rewards.rerank rank model.npz CANDIDATES.jsonl
    python -m orchard.rewards.rerank finetune STORE.jsonl --base DIR --out DIR   (GPU advised)

``evaluate`` splits by task, trains on the rest, and prints one JSON line:
best-of-N vs random vs oracle resolved rate on the held-out tasks, and AUC.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from .evaluation import train_and_evaluate
from .features import make_featurizer
from .model import ValueModel
from .store import TrajectoryStore
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
    args = parser.parse_args(argv)

    if args.command == "evaluate":
        if args.synthetic == (args.store is not None):
            parser.error("give a STORE or --synthetic (one of them)")
        rollouts = (
            generate(seed=args.seed) if args.synthetic else TrajectoryStore(args.store).load()
        )
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
        model = ValueModel.load(args.model)
        candidates = TrajectoryStore(args.candidates).load()
        for index, score in model.rank(candidates):
            print(
                json.dumps({"rollout_id": candidates[index].rollout_id, "score": round(score, 4)})
            )
    else:
        from .hf_finetune import finetune

        print(
            json.dumps(
                finetune(TrajectoryStore(args.store).load(), args.base, args.out, args.epochs)
            )
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
