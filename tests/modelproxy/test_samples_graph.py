"""The message graph on hand-made call sequences: linear, compaction, a sub-agent between the
main agent's turns, rewritten history, re-tokenised history, missing token ids, a fan-out.

The records are built with the scripted engine's template and tokenizer
(``scripted_upstream``), so what stitches here is what an engine's tokens would stitch."""

from __future__ import annotations

from typing import Any

from orchard.modelproxy.samples import samples

from orchard.testing.scripted_model import completion_text, logprob_of, prompt_ids, tokens

SYSTEM = {"role": "system", "content": "you fix bugs"}
SESSION = {"id": "ses_x", "reward": 1.0, "fault": "", "fault_message": ""}


class Calls:
    """A session's records, one call at a time, as the proxy would record them."""

    def __init__(self) -> None:
        self.records: list[dict[str, Any]] = []

    def call(self, messages: list[dict[str, Any]], content: str, *, token_ids: bool = True,
             prompt: list[int] | None = None) -> dict[str, Any]:  # fmt: skip
        entry = {"content": content}
        completion = tokens(completion_text(entry))
        self.records.append({
            "index": len(self.records), "status": 200, "retries": 0, "model_version": "v1",
            "upstream_request": {"messages": list(messages)},
            "response": {"choices": [{"message": {"role": "assistant", "content": content}}]},
            "prompt_token_ids": (prompt or prompt_ids(messages)) if token_ids else None,
            "completion_token_ids": completion if token_ids else None,
            "completion_logprobs": [logprob_of(t) for t in completion] if token_ids else None,
        })  # fmt: skip
        return {"role": "assistant", "content": content}


def _model_spans(sample: dict[str, Any]) -> list[str]:
    """The text under loss_mask 1, one string per contiguous span."""
    spans, current = [], ""
    for token, bit in zip(sample["tokens"], sample["loss_mask"], strict=True):
        if bit:
            current += chr(token)
        elif current:
            spans.append(current)
            current = ""
    return [*spans, current] if current else spans


def test_linear_conversation_is_one_token_exact_sample() -> None:
    c = Calls()
    history = [SYSTEM, {"role": "user", "content": "tests fail"}]
    history.append(c.call(history, "run pytest"))
    history.append({"role": "tool", "content": "1 failed", "tool_call_id": "t1"})
    history.append(c.call(history, "edit calc.py"))
    history.append({"role": "user", "content": "done?"})
    c.call(history, "yes")
    [sample] = samples(c.records, SESSION)
    assert sample["calls"] == [0, 1, 2] and sample["root"]["reason"] == "first"
    assert sample["token_exact"] is True
    assert _model_spans(sample) == ["run pytest</s>", "edit calc.py</s>", "yes</s>"]
    assert sample["tokens"] == prompt_ids(history) + tokens("yes</s>")
    assert sample["prompt_length"] == len(prompt_ids(history[:2]))
    masked = [lp for lp, bit in zip(sample["logprobs"], sample["loss_mask"], strict=True) if bit]
    assert masked == [logprob_of(t) for t in tokens("run pytest</s>edit calc.py</s>yes</s>")]
    assert all(
        lp == 0.0
        for lp, bit in zip(sample["logprobs"], sample["loss_mask"], strict=True)
        if not bit
    )
    assert sample["reward"] == 1.0 and sample["trainable"] is True


def test_compaction_starts_a_new_branch() -> None:
    c = Calls()
    history = [SYSTEM, {"role": "user", "content": "task"}]
    history.append(c.call(history, "step one"))
    history.append({"role": "user", "content": "go on"})
    c.call(history, "step two")
    compacted = [SYSTEM, {"role": "user", "content": "summary: did steps one and two"}]
    c.call(compacted, "step three")
    first, second = samples(c.records, SESSION)
    assert first["calls"] == [0, 1] and _model_spans(first) == ["step one</s>", "step two</s>"]
    assert second["calls"] == [2]
    assert second["root"] == {
        "reason": "prefix_changed",
        "parent_call": 1,
        "common_prefix_messages": 1,
    }
    assert _model_spans(second) == ["step three</s>"]  # the summary is not model tokens here


def test_sub_agent_between_main_turns_is_its_own_branch_and_the_main_one_continues() -> None:
    c = Calls()
    main = [SYSTEM, {"role": "user", "content": "fix the bug"}]
    main.append(c.call(main, "delegating search"))
    sub = [
        {"role": "system", "content": "you search code"},
        {"role": "user", "content": "find add()"},
    ]
    sub.append(c.call(sub, "calc.py:3"))
    main.append({"role": "tool", "content": "calc.py:3", "tool_call_id": "t"})
    c.call(main, "editing calc.py")
    out = samples(c.records, SESSION)
    by_calls = {tuple(s["calls"]): s for s in out}
    assert set(by_calls) == {(1,), (0, 2)}
    assert by_calls[(1,)]["root"]["reason"] == "new_context"
    assert _model_spans(by_calls[(0, 2)]) == ["delegating search</s>", "editing calc.py</s>"]


def test_rewritten_history_is_not_stitched() -> None:
    c = Calls()
    history = [SYSTEM, {"role": "user", "content": "task"}]
    reply = c.call(history, "I will rm -rf /")
    rewritten = [*history, {"role": "assistant", "content": "I will run the tests"},
                 {"role": "user", "content": "ok"}]  # fmt: skip
    c.call(rewritten, "tests pass")
    first, second = samples(c.records, SESSION)
    assert reply["content"] not in str(second["tokens"])
    assert second["root"]["reason"] == "prefix_changed"
    assert second["root"]["common_prefix_messages"] == 2
    assert _model_spans(second) == ["tests pass</s>"]  # the rewritten turn is not trained on
    assert first["calls"] == [0]


def test_retokenized_history_says_so_and_claims_no_earlier_tokens() -> None:
    c = Calls()
    history = [SYSTEM, {"role": "user", "content": "task"}]
    history.append(c.call(history, "thinking... answer"))
    history.append({"role": "user", "content": "next"})
    # the engine's template re-rendered the earlier turn (dropped a token): same messages
    rendered = prompt_ids(history)
    c.call(history, "final", prompt=rendered[:40] + rendered[41:])
    first, second = samples(c.records, SESSION)
    assert second["root"] == {"reason": "retokenized", "parent_call": 0}
    assert _model_spans(second) == ["final</s>"]
    assert first["token_exact"] and second["token_exact"]


def test_missing_token_ids_are_said_not_guessed() -> None:
    c = Calls()
    history = [SYSTEM, {"role": "user", "content": "task"}]
    history.append(c.call(history, "one", token_ids=False))
    history.append({"role": "user", "content": "more"})
    c.call(history, "two")
    [sample] = samples(c.records, SESSION)
    assert sample["calls"] == [0, 1]  # linked by messages
    assert sample["token_exact"] is False and sample["tokens"] is None
    assert sample["not_token_exact"]["calls"] == [0]
    assert sample["messages"][-1] == {"role": "assistant", "content": "two"}


def test_fan_out_from_one_call_gives_a_sample_per_branch() -> None:
    c = Calls()
    history = [SYSTEM, {"role": "user", "content": "task"}]
    history.append(c.call(history, "plan"))
    for attempt in ("try A", "try B"):
        c.call([*history, {"role": "user", "content": attempt}], attempt.upper())
    out = samples(c.records, SESSION)
    assert [s["calls"] for s in out] == [[0, 1], [0, 2]]
    assert [_model_spans(s) for s in out] == [["plan</s>", "TRY A</s>"], ["plan</s>", "TRY B</s>"]]


def test_infrastructure_fault_masks_the_rollout() -> None:
    c = Calls()
    c.call([SYSTEM, {"role": "user", "content": "task"}], "x")
    [sample] = samples(c.records, {**SESSION, "reward": None, "fault": "infrastructure"})
    assert sample["trainable"] is False and sample["fault"] == "infrastructure"


def test_failed_calls_are_no_nodes() -> None:
    c = Calls()
    c.call([SYSTEM, {"role": "user", "content": "task"}], "x")
    c.records.append({"index": 1, "status": 500, "response": None, "upstream_request": {}})
    assert [s["calls"] for s in samples(c.records, SESSION)] == [[0]]
