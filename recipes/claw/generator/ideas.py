"""Task ideas: what the propose stage asks for and how each proposed idea is checked.

The model answers the propose prompt with ``{"ideas": [{"id", "title", "summary",
"services"}, ...]}``. Each idea is checked on its own (:func:`read_ideas`): an id that is a
slug (it becomes a file name and the task id), not one of the existing task ids nor proposed
twice, bounded text, services only among those the environment offers. A bad idea is
*rejected with its reason* (it is listed in the manifest), never silently dropped; a reply
that is not the documented shape at all raises :class:`MalformedReply`.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any

from .replies import MalformedReply

ID_PATTERN = re.compile(r"^[a-z0-9][a-z0-9_-]{2,63}$")
MAX_TITLE = 200
MAX_SUMMARY = 2000
MAX_IDEAS = 50


@dataclass(frozen=True)
class Idea:
    """One proposed task: its id (the task's), category, title, summary, services used."""

    id: str
    category: str
    title: str
    summary: str
    services: tuple[str, ...] = ()

    def as_dict(self) -> dict[str, Any]:
        return {"id": self.id, "category": self.category, "title": self.title,
                "summary": self.summary, "services": list(self.services)}  # fmt: skip


@dataclass(frozen=True)
class RejectedIdea:
    """A proposed idea that was not taken, and why (its raw id as given, cut)."""

    id: str
    code: str
    """``invalid_idea``, ``duplicate`` (an existing task's id, or proposed twice) or
    ``over_limit`` (more ideas than asked for)."""
    reason: str


def _text(item: Mapping[str, Any], key: str, limit: int) -> str:
    value = item.get(key)
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"{key!r} must be a non-empty string")
    if len(value) > limit:
        raise ValueError(f"{key!r} has {len(value)} characters, over {limit}")
    return value.strip()


def _one(item: Any, category: str, services: Collection[str]) -> Idea:
    if not isinstance(item, dict):
        raise ValueError(f"an idea must be an object, not {type(item).__name__}")
    unknown = set(item) - {"id", "title", "summary", "services", "category"}
    if unknown:
        raise ValueError(f"unknown fields {sorted(unknown)}")
    idea_id = item.get("id")
    if not isinstance(idea_id, str) or not ID_PATTERN.fullmatch(idea_id):
        raise ValueError(f"id {idea_id!r:.80} is not a slug matching {ID_PATTERN.pattern}")
    if item.get("category", category) != category:
        raise ValueError(f"category {item.get('category')!r:.80} is not the asked {category!r}")
    used = item.get("services", [])
    if not isinstance(used, list) or not all(isinstance(s, str) for s in used):
        raise ValueError("'services' must be a list of service names")
    if len(used) > len(services) or set(used) - set(services):
        raise ValueError(f"services {sorted(set(used) - set(services))!r:.200} are not offered")
    return Idea(idea_id, category, _text(item, "title", MAX_TITLE),
                _text(item, "summary", MAX_SUMMARY), tuple(dict.fromkeys(used)))  # fmt: skip


def read_ideas(
    reply: Mapping[str, Any],
    *,
    category: str,
    services: Collection[str],
    existing: Collection[str],
    limit: int,
) -> tuple[list[Idea], list[RejectedIdea]]:
    """The accepted ideas of a propose reply (at most ``limit``) and the rejected ones."""
    items = reply.get("ideas")
    if set(reply) != {"ideas"} or not isinstance(items, list):
        raise MalformedReply('the reply must be {"ideas": [...]} and nothing else')
    if len(items) > MAX_IDEAS:
        raise MalformedReply(f"{len(items)} ideas, over the {MAX_IDEAS} a reply may hold")
    taken: list[Idea] = []
    rejected: list[RejectedIdea] = []
    seen = set(existing)
    for n, item in enumerate(items):
        raw_id = str(item.get("id", f"#{n}"))[:80] if isinstance(item, dict) else f"#{n}"
        try:
            idea = _one(item, category, services)
        except ValueError as err:
            rejected.append(RejectedIdea(raw_id, "invalid_idea", f"invalid idea: {err}"))
            continue
        if idea.id in seen:
            why = "duplicate of an existing task" if idea.id in existing else "proposed twice"
            rejected.append(RejectedIdea(idea.id, "duplicate", f"{why}: {idea.id}"))
            continue
        if len(taken) >= limit:
            rejected.append(
                RejectedIdea(idea.id, "over_limit", f"over the {limit} ideas asked for")
            )
            continue
        seen.add(idea.id)
        taken.append(idea)
    return taken, rejected
