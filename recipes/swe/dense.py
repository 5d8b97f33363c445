"""Dense rewards: the process reward model on a finished rollout, and teacher log-probabilities.

**Process reward** (:func:`process_reward`, :func:`apply_process_reward`). A graded rollout's
outcome (+1 / -1) plus ``alpha`` times the rubric judge's J, from the rewards service's
``ScoreProcess`` (seven rubrics, snapped, weighted; docs/rewards.md). The service's
anti-hacking gate runs first (a patch that edits tests or adds skips, a trajectory with
destructive commands). Gated, the service answers reward 0; we pay ``failure_reward``
instead (-1 under pm1), because a literal 0 would pay a hack better than an honest failure
(-1 + alpha * J <= -0.5). A judge that gives no verdict leaves the outcome alone
(``judged`` False and the reason) or, with ``drop_unjudged``, leaves no reward at all (the
sample is then not trainable). An aborted or ungraded rollout is never scored.

**Teacher log-probabilities** (:func:`teacher_logprobs`, :func:`add_teacher_logprobs`), for
on-policy distillation: the student's own tokens (a proxy sample's ``tokens``) are sent to a
teacher server as a prompt, and the log-probability the teacher gives each of them comes
back; they go into the sample as ``teacher_logprobs`` aligned with ``tokens`` (0.0 where
``loss_mask`` is 0, as ``logprobs`` are), with ``teacher_model``. Two wire formats:

- ``vllm``: ``POST {base}/completions`` ``{"model", "prompt": [ids], "max_tokens": 1,
  "prompt_logprobs": 0, "temperature": 0}``; the answer's ``choices[0].prompt_logprobs`` is
  one entry per prompt token (``null`` for the first, else ``{"<id>": {"logprob", "rank",
  "decoded_token"}}`` holding at least the prompt token itself).
- ``sglang``: ``POST {root}/generate`` ``{"input_ids": [ids], "sampling_params":
  {"max_new_tokens": 0, "temperature": 0}, "return_logprob": true, "logprob_start_len": 0}``;
  the answer's ``meta_info.input_token_logprobs`` is ``[[logprob | null, token_id, text], ...]``.

The teacher must share the student's tokenizer (the ids are the student's); an answer whose
length or token ids do not match the prompt is refused with a clear error, never aligned by
guess. HTTP is the standard library's, run in a thread: the recipe's core needs no extra
package and a teacher call is one request per sample.
"""

from __future__ import annotations

import asyncio
import json
import math
import urllib.error
import urllib.request
from collections.abc import Awaitable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from orchard import ProcessReward
from orchard.rollouts import RolloutResult, Status, Task

DEFAULT_ALPHA = 0.5


class ProcessScorer(Protocol):
    """What :class:`orchard.AsyncRewards` offers (``score_process``)."""

    def score_process(
        self,
        task: str,
        trajectory: Sequence[Mapping[str, Any]],
        patch: str,
        outcome: float,
        alpha: float = ...,
        gold_patch: str = ...,
        fail_to_pass: Sequence[str] = ...,
    ) -> Awaitable[ProcessReward]: ...


@dataclass(frozen=True)
class DenseReward:
    reward: float | None
    """outcome + alpha * J; ``failure_reward`` when gated; None when dropped (unjudged)."""
    outcome: float
    judged: bool
    j: float
    gated: bool
    gate_reasons: list[str] = field(default_factory=list)
    scores: dict[str, float] = field(default_factory=dict)
    failure: str = ""

    def as_dict(self) -> dict[str, Any]:
        return {
            "reward": self.reward, "outcome": self.outcome, "judged": self.judged, "j": self.j,
            "gated": self.gated, "gate_reasons": self.gate_reasons, "scores": self.scores,
            "failure": self.failure,
        }  # fmt: skip


def trajectory_of(result: RolloutResult) -> list[dict[str, Any]]:
    """The conversation the judge reads: the transcript when it is a message list, else the
    longest recorded sample's messages (the leaf that holds the whole run)."""
    transcript = result.transcript
    if isinstance(transcript, list) and all(
        isinstance(m, dict) and "role" in m for m in transcript
    ):
        return [dict(m) for m in transcript]
    messages = [s.get("messages") or [] for s in result.samples]
    longest = max(messages, key=len, default=[])
    return [{"role": m.get("role"), "content": m.get("content") or ""} for m in longest]


async def process_reward(
    result: RolloutResult,
    task: Task,
    scorer: ProcessScorer,
    *,
    alpha: float = DEFAULT_ALPHA,
    failure_reward: float = -1.0,
    drop_unjudged: bool = False,
    gold_patch: str = "",
    fail_to_pass: Sequence[str] = (),
) -> DenseReward | None:
    """The dense reward of one graded rollout; None for an aborted or ungraded one."""
    if result.status is Status.ABORTED or result.reward is None:
        return None
    outcome = float(result.reward)
    answer = await scorer.score_process(
        task.prompt,
        trajectory_of(result),
        result.diff,
        outcome,
        alpha,
        gold_patch,
        list(fail_to_pass),
    )
    if answer.gated:
        return DenseReward(failure_reward, outcome, answer.judged, answer.j, True,
                           list(answer.gate_reasons), dict(answer.scores), answer.failure)  # fmt: skip
    if not answer.judged:
        return DenseReward(None if drop_unjudged else outcome, outcome, False, 0.0, False,
                           [], {}, answer.failure)  # fmt: skip
    reward = outcome + alpha * answer.j
    if not math.isclose(reward, answer.reward, abs_tol=1e-6):
        raise ValueError(
            f"the rewards service answered reward {answer.reward} for outcome {outcome} + "
            f"{alpha} * J {answer.j}: the two disagree"
        )
    return DenseReward(reward, outcome, True, answer.j, False, [], dict(answer.scores), "")


async def apply_process_reward(
    result: RolloutResult, task: Task, scorer: ProcessScorer, **options: Any
) -> DenseReward | None:
    """:func:`process_reward`, written into the rollout: ``reward`` (the outcome kept in
    ``detail["outcome_reward"]``), ``detail["prm"]``, and every sample's ``reward`` /
    ``outcome_reward`` / ``prm`` (``trainable`` False where the reward was dropped)."""
    dense = await process_reward(result, task, scorer, **options)
    if dense is None:
        return None
    result.detail["outcome_reward"] = dense.outcome
    result.detail["prm"] = dense.as_dict()
    result.reward = dense.reward
    for sample in result.samples:
        sample["outcome_reward"] = dense.outcome
        sample["reward"] = dense.reward
        sample["prm"] = dense.as_dict()
        if dense.reward is None:
            sample["trainable"] = False
    return dense


class TeacherError(RuntimeError):
    """The teacher server refused, failed, or answered something that does not fit the prompt."""


Kind = Literal["vllm", "sglang"]


def _post(url: str, body: dict[str, Any], api_key: str, timeout: float) -> Any:
    request = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST")
    request.add_header("Content-Type", "application/json")
    if api_key:
        request.add_header("Authorization", f"Bearer {api_key}")
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return json.loads(response.read())
    except urllib.error.HTTPError as err:
        raise TeacherError(f"{url}: HTTP {err.code}: {err.read()[:500]!r}") from None
    except (urllib.error.URLError, TimeoutError, OSError) as err:
        raise TeacherError(f"{url}: {err}") from None
    except json.JSONDecodeError as err:
        raise TeacherError(f"{url}: the answer is not JSON ({err})") from None


def _entries(answer: Any, path: tuple[str | int, ...], ids: Sequence[int]) -> list[Any]:
    """The per-token list at ``path`` in the teacher's answer, one entry per token asked about."""
    where = ".".join(f"[{p}]" if isinstance(p, int) else p for p in path).replace(".[", "[")
    found = answer
    try:
        for step in path:
            found = found[step]
    except (KeyError, IndexError, TypeError):
        raise TeacherError(f"the teacher's answer has no {where}") from None
    if not isinstance(found, list) or len(found) != len(ids):
        count = len(found) if isinstance(found, list) else "?"
        raise TeacherError(f"{where} has {count} entries for {len(ids)} tokens")
    return found


def _vllm_values(answer: Any, ids: Sequence[int]) -> list[float | None]:
    values: list[float | None] = []
    for i, (entry, token) in enumerate(
        zip(_entries(answer, ("choices", 0, "prompt_logprobs"), ids), ids, strict=True)
    ):
        if entry is None:
            if i:
                raise TeacherError(f"no log-probability for prompt token {i}")
            values.append(None)
            continue
        item = entry.get(str(token)) if isinstance(entry, dict) else None
        if not isinstance(item, dict) or not isinstance(item.get("logprob"), int | float):
            raise TeacherError(f"prompt token {i} (id {token}) is not in the teacher's answer")
        values.append(float(item["logprob"]))
    return values


def _sglang_values(answer: Any, ids: Sequence[int]) -> list[float | None]:
    values: list[float | None] = []
    for i, (entry, token) in enumerate(
        zip(_entries(answer, ("meta_info", "input_token_logprobs"), ids), ids, strict=True)
    ):
        if not isinstance(entry, list) or len(entry) < 2 or entry[1] != token:
            raise TeacherError(
                f"input token {i}: expected id {token}, the teacher answered {entry!r}"
            )
        if entry[0] is None and i:
            raise TeacherError(f"no log-probability for input token {i}")
        values.append(None if entry[0] is None else float(entry[0]))
    return values


async def teacher_logprobs(
    ids: Sequence[int],
    base_url: str,
    model: str = "",
    *,
    kind: Kind = "vllm",
    api_key: str = "",
    timeout: float = 300.0,  # noqa: ASYNC109 (the HTTP call's own timeout)
) -> list[float | None]:
    """The teacher's log-probability of each token given the ones before it (None for the first).

    ``base_url``: vLLM's OpenAI base (``http://host:8000/v1``); SGLang's server root (a
    trailing ``/v1`` is taken off: ``/generate`` is not under it).
    """
    if not ids:
        raise TeacherError("no tokens to score")
    base = base_url.rstrip("/")
    if kind == "vllm":
        body = {"model": model, "prompt": list(ids), "max_tokens": 1, "prompt_logprobs": 0,
                "temperature": 0.0}  # fmt: skip
        answer = await asyncio.to_thread(_post, base + "/completions", body, api_key, timeout)
        return _vllm_values(answer, ids)
    if kind == "sglang":
        root = base.removesuffix("/v1")
        body = {"input_ids": list(ids), "return_logprob": True, "logprob_start_len": 0,
                "sampling_params": {"max_new_tokens": 0, "temperature": 0.0}}  # fmt: skip
        if model:
            body["model"] = model
        answer = await asyncio.to_thread(_post, root + "/generate", body, api_key, timeout)
        return _sglang_values(answer, ids)
    raise ValueError(f"unknown teacher kind {kind!r} (vllm or sglang)")


async def add_teacher_logprobs(
    sample: dict[str, Any],
    base_url: str,
    model: str = "",
    *,
    kind: Kind = "vllm",
    api_key: str = "",
    timeout: float = 300.0,  # noqa: ASYNC109
) -> dict[str, Any]:
    """Write ``teacher_logprobs`` (aligned with ``tokens``; 0.0 where ``loss_mask`` is 0) and
    ``teacher_model`` into a token-exact proxy sample, and return it."""
    tokens, mask = sample.get("tokens"), sample.get("loss_mask")
    if not sample.get("token_exact") or tokens is None or mask is None:
        raise TeacherError(
            f"sample {sample.get('session_id')}/{sample.get('sample_index')} is not token-exact: "
            "there are no student tokens to score"
        )
    values = await teacher_logprobs(
        tokens, base_url, model, kind=kind, api_key=api_key, timeout=timeout
    )
    out: list[float] = []
    for i, (value, m) in enumerate(zip(values, mask, strict=True)):
        if m and value is None:
            raise TeacherError(
                f"token {i} is sampled (loss mask 1) but has no teacher log-probability"
            )
        out.append(float(value) if m and value is not None else 0.0)
    sample["teacher_logprobs"] = out
    sample["teacher_model"] = model
    return sample
