"""``orchard reward``: the rewards service from the shell.

    orchard reward grade INSTANCE.json PATCH [--scheme pm1|binary|pass_rate] [--id ID]
    orchard reward rank TASK.txt CANDIDATES.jsonl

``grade`` reads one instance (a JSON object, or a JSONL file and ``--id`` to
pick a row), the patch or agent output from PATCH (``-`` = stdin), runs the
tests in a fresh sandbox through the rewards service and prints the report as
JSON. Exit code 0 when resolved, 3 when graded but not resolved (no patch,
patch does not apply, timeout, failing tests), 4 for an infrastructure
failure (drop the sample), 1 for an Orchard error.

``rank`` reads candidate rollouts (JSONL of ``{"id", "trajectory", "patch"}``)
and prints them best first with P(resolved) (the service needs --value-model).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from orchard.client import InvalidRequestError, Rewards


def register(commands: Any) -> None:
    p = commands.add_parser("reward", help="grade, rank (the rewards service)")
    p.add_argument(
        "--rewards-endpoint",
        default=None,
        help="default $ORCHARD_REWARDS_ENDPOINT or the local stack's",
    )
    sub = p.add_subparsers(dest="reward_command", required=True, metavar="SUBCOMMAND")
    g = sub.add_parser("grade", help="run an instance's tests on a patch and grade them")
    g.add_argument("instance", type=Path, help="instance JSON (or JSONL with --id)")
    g.add_argument("patch", help="patch or agent output file, - for stdin")
    g.add_argument("--id", default=None, help="instance_id to pick from a JSONL file")
    g.add_argument(
        "--scheme",
        default="pm1",
        choices=["pm1", "binary", "pass_rate"],
        help="pm1: +1 resolved, -1 otherwise; binary: 1 or 0; pass_rate: weighted F2P/P2P pass rates",
    )
    g.add_argument(
        "--test-timeout", type=float, default=0.0, help="seconds (default: the service's)"
    )
    g.add_argument("--log", action="store_true", help="also print the eval log's tail to stderr")
    g.set_defaults(run=cmd_grade)
    r = sub.add_parser("rank", help="rank candidate rollouts of one task with the value model")
    r.add_argument("task", type=Path, help="file with the task text")
    r.add_argument("candidates", type=Path, help='JSONL: {"id", "trajectory", "patch"} per line')
    r.set_defaults(run=cmd_rank)


def _instance(path: Path, instance_id: str | None) -> dict[str, Any]:
    text = path.read_text()
    try:
        value = json.loads(text)
        rows = [value] if isinstance(value, dict) else list(value)
    except json.JSONDecodeError:
        rows = [json.loads(line) for line in text.splitlines() if line.strip()]
    if instance_id is not None:
        rows = [
            r
            for r in rows
            if r.get("instance_id", r.get("metadata", {}).get("instance_id")) == instance_id
        ]
    if len(rows) != 1:
        raise InvalidRequestError(
            f"{path}: {len(rows)} instances match; give a single one or --id INSTANCE_ID"
        )
    row: dict[str, Any] = rows[0]
    return row


def cmd_grade(args: argparse.Namespace) -> int:
    try:
        instance = _instance(args.instance, args.id)
        output = sys.stdin.read() if args.patch == "-" else Path(args.patch).read_text()
    except (OSError, json.JSONDecodeError) as exc:
        raise InvalidRequestError(f"cannot read the input: {exc}") from None
    rewards = Rewards(args.rewards_endpoint, args.api_key)
    report = rewards.grade(instance, output, scheme=args.scheme, test_timeout=args.test_timeout)
    out = {
        "instance_id": report.instance_id, "kind": report.kind, "resolved": report.resolved,
        "resolution": report.resolution, "reward": report.reward, "apply_method": report.apply_method,
        "fail_to_pass": {"success": report.fail_to_pass[0], "failure": report.fail_to_pass[1]},
        "pass_to_pass": {"success": report.pass_to_pass[0], "failure": report.pass_to_pass[1]},
        "reason": report.reason[-2000:], "duration_seconds": round(report.duration_seconds, 3),
        "fault": report.fault, "integrity": report.integrity, "findings": report.findings,
        "restored_files": report.restored_files,
    }  # fmt: skip
    print(json.dumps(out, indent=1))
    if args.log:
        print(report.log_tail, file=sys.stderr)
    if report.is_infrastructure:
        return 4
    return 0 if report.resolved else 3


def cmd_rank(args: argparse.Namespace) -> int:
    try:
        task = args.task.read_text()
        candidates = [
            json.loads(line) for line in args.candidates.read_text().splitlines() if line.strip()
        ]
    except (OSError, json.JSONDecodeError) as exc:
        raise InvalidRequestError(f"cannot read the input: {exc}") from None
    for rank, (cid, score) in enumerate(
        Rewards(args.rewards_endpoint, args.api_key).rank(task, candidates), 1
    ):
        print(json.dumps({"rank": rank, "id": cid, "score": round(score, 4)}))
    return 0
