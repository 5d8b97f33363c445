"""Rubric prompts as versioned templates.

A template's ``version`` is part of the cache key: change the wording, bump the
version, and old verdicts are not reused. ``user`` is a ``str.format`` string
over the call's inputs; a missing input is a clear error, not an empty slot.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from string import Formatter
from typing import Any


@dataclass(frozen=True)
class RubricTemplate:
    name: str
    version: str
    system: str
    user: str
    schema: dict[str, Any] = field(default_factory=dict)

    @property
    def key(self) -> str:
        return f"{self.name}@{self.version}"

    @property
    def fields(self) -> set[str]:
        return {f for _, f, _, _ in Formatter().parse(self.user) if f}

    def render(self, inputs: Mapping[str, str]) -> str:
        missing = sorted(self.fields - set(inputs))
        if missing:
            raise KeyError(f"template {self.key} needs inputs {missing}")
        return self.user.format(**{k: inputs[k] for k in self.fields})


PATCH_VERDICT = RubricTemplate(
    name="patch_verdict",
    version="1",
    system=(
        "You are a strict code reviewer. Answer with one JSON object only, no prose, "
        'of the form {"reasoning": "...", "verdict": "correct"|"incorrect", "score": 0.0-1.0}.'
    ),
    user=(
        "Task:\n{task}\n\nCandidate patch:\n```diff\n{patch}\n```\n\n"
        "Does the patch correctly and completely solve the task without breaking other behaviour?"
    ),
    schema={
        "type": "object",
        "required": ["reasoning", "verdict", "score"],
        "properties": {
            "reasoning": {"type": "string"},
            "verdict": {"type": "string", "enum": ["correct", "incorrect"]},
            "score": {"type": "number", "minimum": 0, "maximum": 1},
        },
    },
)

# Credit assignment for SFT on failed trajectories (recipes/swe/casft.py,
# docs/recipes/swe-training.md): the teacher knows the outcome and says, per step, how likely
# success still was after it; the step with the largest drop is the critical mistake.
STEP_CREDIT = RubricTemplate(
    name="step_credit",
    version="1",
    system=(
        "You assess how an AI software agent worked on a task whose final outcome you are told. "
        "For every numbered step, estimate the probability (0.0-1.0) that the task would still "
        "end in success if the agent continued competently right after that step. Steps that "
        "make progress keep or raise it; the step where the agent makes the mistake that dooms "
        "the run lowers it sharply. Answer with one JSON object only, no prose: "
        '{"reasoning": "...", "p_start": x, "p_success": [x_1, ..., x_n]} with exactly one '
        "value per step, in step order."
    ),
    user=(
        "Task:\n{task}\n\nOutcome: {outcome}\n\nTrajectory ({step_count} steps; each is the "
        "agent's action and what it observed):\n{steps}\n\nGive p_start (before step 1) and "
        "p_success for steps 1..{step_count}."
    ),
    schema={
        "type": "object",
        "required": ["reasoning", "p_start", "p_success"],
        "properties": {
            "reasoning": {"type": "string"},
            "p_start": {"type": "number", "minimum": 0, "maximum": 1},
            "p_success": {
                "type": "array",
                "items": {"type": "number", "minimum": 0, "maximum": 1},
            },
        },
    },
)

_REGISTRY: dict[str, RubricTemplate] = {}


def register(template: RubricTemplate) -> None:
    _REGISTRY[template.name] = template
    _REGISTRY[template.key] = template


def get_template(name: str) -> RubricTemplate:
    """By ``name`` (latest registered) or ``name@version``."""
    try:
        return _REGISTRY[name]
    except KeyError:
        raise KeyError(f"unknown rubric template {name!r}; known: {sorted(_REGISTRY)}") from None


register(PATCH_VERDICT)
register(STEP_CREDIT)
