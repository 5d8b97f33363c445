"""A session's calls as training samples: a message graph, one sample per branch.

Each successful call is a node. Its parent is the earlier call it *continues*: the one whose
prompt + completion tokens are a prefix of this call's prompt tokens (the longest such, as
NeMo Gym's prefix merging; the latest on a tie, which is the retry-free answer). Where a call
continues no earlier one, it starts a new branch (a root), and says why:

- ``first``: the session's first call;
- ``retokenized``: an earlier call's messages (its prompt and reply) are a prefix of this
  call's messages, but not its tokens: the engine rendered the same history differently
  (a template that drops reasoning, a harness that re-serialised a tool call). The earlier
  model tokens are *not* claimed as this branch's model tokens: they are not what was sampled;
- ``prefix_changed``: the messages share a beginning with an earlier call but diverge
  (compaction, a summarised or rewritten history);
- ``new_context``: nothing in common with any earlier call (a sub-agent, a fresh context).

Each leaf gives one sample: the path root -> leaf. With token ids from the engine on every
call of the path it is token-exact: ``tokens`` = the leaf's prompt + completion, and
``loss_mask`` is 1 exactly on the tokens the model sampled along the path (each call's
completion, at its place in the leaf's sequence), 0 on everything else (system, user, tool
results, template tokens); ``logprobs`` are the engine's, 0.0 where the mask is 0. Without
token ids on some call (or logprobs) the sample says so (``token_exact: false`` and
``not_token_exact``, with the calls it concerns) and carries the messages only; nothing is
re-tokenised or guessed here. Where a harness fans out from one call (parallel tries) that
call has several children and each branch is its own sample sharing the prefix.

The rollout's reward and fault (``POST /v1/sessions/{id}/finish``) are put on every sample;
``trainable`` is false for an infrastructure or client fault (those mask, they never score).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from .recording import answered


def _text(content: Any) -> Any:
    if isinstance(content, list):
        texts = [p.get("text") for p in content if isinstance(p, dict) and p.get("type") == "text"]
        if len(texts) == len(content):
            return "".join(str(t) for t in texts)
    return content


def normal_message(message: dict[str, Any]) -> str:
    """One message as a canonical string: what matters to the conversation, not its spelling."""
    view: dict[str, Any] = {
        "role": message.get("role"),
        "content": _text(message.get("content")) or "",
    }
    if message.get("tool_calls"):
        view["tool_calls"] = [
            [
                c.get("id"),
                (c.get("function") or {}).get("name"),
                (c.get("function") or {}).get("arguments"),
            ]
            for c in message["tool_calls"]
        ]
    if message.get("tool_call_id"):
        view["tool_call_id"] = message["tool_call_id"]
    return json.dumps(view, sort_keys=True)


@dataclass
class _Node:
    record: dict[str, Any]
    prompt_messages: list[str]
    full_messages: list[str]
    prompt: list[int] | None
    completion: list[int] | None
    parent: int | None = None
    root: dict[str, Any] = field(default_factory=dict)
    children: list[int] = field(default_factory=list)

    @property
    def full(self) -> list[int] | None:
        if self.prompt is None or self.completion is None:
            return None
        return self.prompt + self.completion


def _node(record: dict[str, Any]) -> _Node:
    chat = record.get("upstream_request") or {}
    prompt_messages = [normal_message(m) for m in chat.get("messages") or ()]
    choices = (record.get("response") or {}).get("choices") or [{}]
    reply = choices[0].get("message") or {"role": "assistant", "content": ""}
    return _Node(record, prompt_messages, [*prompt_messages, normal_message(reply)],
                 record.get("prompt_token_ids"), record.get("completion_token_ids"))  # fmt: skip


def _common(a: list[str], b: list[str]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def graph(records: list[dict[str, Any]]) -> list[_Node]:
    nodes = [_node(r) for r in records if answered(r)]
    for i, node in enumerate(nodes):
        best, best_len = None, -1
        for j in range(i):
            full = nodes[j].full
            if (full is not None and node.prompt is not None and len(full) <= len(node.prompt)
                    and len(full) >= best_len and node.prompt[: len(full)] == full):  # fmt: skip
                best, best_len = j, len(full)
        if best is None:  # no token continuation: a message one (the latest) where tokens lack
            for j in reversed(range(i)):
                other = nodes[j]
                if other.full_messages == node.prompt_messages[: len(other.full_messages)]:
                    if other.full is not None and node.prompt is not None:
                        node.root = {"reason": "retokenized", "parent_call": other.record["index"]}
                    else:
                        best = j
                    break
        if best is not None:
            node.parent = best
            nodes[best].children.append(i)
            continue
        if node.root:
            continue
        shared = [(_common(nodes[j].full_messages, node.prompt_messages), j) for j in range(i)]
        most, at = max(shared, default=(0, -1))
        if i == 0:
            node.root = {"reason": "first", "parent_call": None}
        elif most > 0:
            node.root = {"reason": "prefix_changed", "parent_call": nodes[at].record["index"],
                         "common_prefix_messages": most}  # fmt: skip
        else:
            node.root = {"reason": "new_context", "parent_call": None}
    return nodes


def _sample(path: list[_Node]) -> dict[str, Any]:
    leaf = path[-1]
    missing = [n.record["index"] for n in path if n.full is None]
    sample: dict[str, Any] = {
        "calls": [n.record["index"] for n in path],
        "root": path[0].root,
        "model_versions": sorted({str(n.record.get("model_version", "")) for n in path}),
        "retries": sum(int(n.record.get("retries", 0)) for n in path),
        "messages": [json.loads(m) for m in leaf.full_messages],
    }
    if missing:
        sample.update(token_exact=False, tokens=None, loss_mask=None, logprobs=None,
                      not_token_exact={"reason": "the upstream returned no token ids", "calls": missing})  # fmt: skip
        return sample
    tokens = leaf.full
    assert tokens is not None
    mask = [0] * len(tokens)
    logprobs: list[float] | None = [0.0] * len(tokens)
    no_logprobs = []
    for n in path:
        assert n.prompt is not None and n.completion is not None
        start = len(n.prompt)
        mask[start : start + len(n.completion)] = [1] * len(n.completion)
        values = n.record.get("completion_logprobs")
        if values is None or len(values) != len(n.completion):
            no_logprobs.append(n.record["index"])
        elif logprobs is not None:
            logprobs[start : start + len(values)] = [float(v) for v in values]
    sample.update(token_exact=True, tokens=tokens, loss_mask=mask,
                  logprobs=None if no_logprobs else logprobs,
                  prompt_length=len(path[0].prompt or ()))  # fmt: skip
    if no_logprobs:
        sample["no_logprobs_calls"] = no_logprobs
    return sample


def samples(records: list[dict[str, Any]], session: dict[str, Any]) -> list[dict[str, Any]]:
    """The session's samples, one per branch (root -> leaf), in the order their leaves came."""
    nodes = graph(records)
    out: list[dict[str, Any]] = []
    for node in nodes:
        if node.children:
            continue
        path, at = [node], node.parent
        while at is not None:
            path.append(nodes[at])
            at = nodes[at].parent
        path.reverse()
        sample = _sample(path)
        fault = session.get("fault", "")
        out.append({
            "session_id": session.get("id"), "sample_index": len(out), **sample,
            "reward": session.get("reward"), "fault": fault,
            "fault_message": session.get("fault_message", ""),
            "trainable": fault not in ("infrastructure", "client") and session.get("reward") is not None,
        })  # fmt: skip
    return out
