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
