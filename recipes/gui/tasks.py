"""GUI task rows: WebGym-style web tasks from a file, and MiniWoB++ tasks, as :class:`GuiTask` s.

A WebGym row (the fields its public AReaL loader reads, ``microsoft/webgym``'s
``areal/dataset/webgym.py``): ``task_id``, ``task_name`` (or ``task``), ``website``,
``domain``, ``subdomain``, ``difficulty``, ``evaluator_reference`` (the rubric: fact groups,
a list or its JSON string), ``reference_answer``. Two optional fields the five-stage filter
reads (:mod:`orchard.recipes.gui.filters`), named here because WebGym's published rows do not
say how they carry them: ``parent_task_id`` (the task a decomposed subtask was cut from) and
``source`` (the seed benchmark the task came from). Unknown fields are kept in ``extra``.

``load_tasks(path)`` reads ``.jsonl`` / ``.json`` / ``.parquet`` (the SWE recipe's reader,
:func:`orchard.recipes.swe.tasks.read_rows`, which is generic) and validates every row with
pydantic; the first bad row stops the load with a
:class:`~orchard.recipes.swe.tasks.TaskRowError` naming file, row and field. Live-web tasks
cannot run on this machine (no internet): they are loaded and filtered, and a rollout of one
needs a sandbox whose network policy reaches the site.

MiniWoB++ tasks (PyPI ``miniwob``: HTML tasks served inside the sandbox) are rows too
(:func:`miniwob_task`): ``kind="miniwob"``, their instruction is the environment's utterance
at reset, their ground truth the environment's own reward.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlsplit

from orchard.recipes.swe.tasks import TaskRowError, read_rows
from orchard.recipes.swe.tasks._rows import _json_if_text  # generic: a JSON string of a list
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

MAX_INSTRUCTION_CHARS = 20_000
MAX_FACTS = 1_000
Difficulty = Literal["easy", "medium", "hard"]


def site_of(website: str) -> str:
    """The site of a URL or bare host: its lowercased host without ``www.`` (``example.com``)."""
    text = website.strip()
    if "://" not in text:
        text = "http://" + text
    host = (urlsplit(text).hostname or "").lower().rstrip(".")
    return host[4:] if host.startswith("www.") else host


class WebGymRow(BaseModel):
    """One WebGym task row, field by field."""

    model_config = ConfigDict(extra="allow", populate_by_name=True)

    task_id: str = Field(min_length=1, max_length=200)
    task_name: str = Field(min_length=1, max_length=MAX_INSTRUCTION_CHARS)
    website: str = Field(min_length=1, max_length=2000)
    domain: str = ""
    subdomain: str = ""
    difficulty: Difficulty | None = None
    evaluator_reference: list[Any] = Field(default_factory=list, max_length=MAX_FACTS)
    reference_answer: str | None = None
    parent_task_id: str | None = None
    source: str = ""

    @model_validator(mode="before")
    @classmethod
    def _task_alias(cls, data: Any) -> Any:
        """``task`` is the older name of ``task_name`` (the loader reads either, not both)."""
        if isinstance(data, dict) and "task" in data:
            if "task_name" in data and data["task_name"] != data["task"]:
                raise ValueError("task_name: both task_name and task are given and differ")
            data = {**data, "task_name": data["task"]}
            del data["task"]
        return data

    @field_validator("task_id", "parent_task_id", mode="before")
    @classmethod
    def _id_text(cls, value: Any) -> Any:
        if isinstance(value, int) and not isinstance(value, bool):
            return str(value)
        return value

    @field_validator("domain", "subdomain", "source", mode="before")
    @classmethod
    def _text_or_null(cls, value: Any) -> Any:
        """A missing column of a Parquet export reads as null."""
        return "" if value is None else value

    @field_validator("difficulty", mode="before")
    @classmethod
    def _difficulty(cls, value: Any) -> Any:
        if value is None or value == "":
            return None
        return value.lower() if isinstance(value, str) else value

    @field_validator("evaluator_reference", mode="before")
    @classmethod
    def _rubric(cls, value: Any) -> Any:
        value = _json_if_text(value)
        if value is None or value == "":
            return []
        if hasattr(value, "tolist"):  # a numpy array out of a Parquet reader
            value = value.tolist()
        if isinstance(value, dict | str):  # one group, or one fact as plain text
            return [value]
        return value

    @field_validator("website")
    @classmethod
    def _website(cls, value: str) -> str:
        if not site_of(value):
            raise ValueError(f"no host in {value[:200]!r}")
        return value.strip()


@dataclass(frozen=True)
class GuiTask:
    """A GUI task whatever its source: a WebGym row (``kind="web"``) or MiniWoB (``"miniwob"``)."""

    id: str
    kind: Literal["web", "miniwob"]
    instruction: str
    website: str
    domain: str = ""
    subdomain: str = ""
    difficulty: str | None = None
    facts: tuple[str, ...] = ()
    """The rubric flattened to one text per fact (a fact group's facts in order)."""
    reference_answer: str | None = None
    parent_id: str | None = None
    source: str = ""
    miniwob: str | None = None
    """The MiniWoB task name (``click-button``) for ``kind="miniwob"``."""
    extra: Mapping[str, Any] = field(default_factory=dict)

    @property
    def site(self) -> str:
        return site_of(self.website) if self.kind == "web" else "miniwob"


def _facts(rubric: Sequence[Any]) -> tuple[str, ...]:
    """Fact texts of a rubric: a group is a string, a list of strings, or an object with
    ``facts`` (a list) or ``fact`` / ``description`` (a string)."""
    out: list[str] = []

    def add(item: Any) -> None:
        if isinstance(item, str):
            if item.strip():
                out.append(item.strip())
        elif isinstance(item, list | tuple):
            for sub in item:
                add(sub)
        elif isinstance(item, dict):
            for key in ("facts", "fact", "description", "criterion"):
                if key in item:
                    add(item[key])
                    return
            raise ValueError(f"a rubric entry has none of facts/fact/description: {item!r:.120}")
        else:
            raise ValueError(f"a rubric entry is a {type(item).__name__}, not text or a group")

    for group in rubric:
        add(group)
    return tuple(out)


def _field(error: Mapping[str, Any]) -> str:
    return ".".join(str(part) for part in error["loc"]) or "(row)"


def parse_row(raw: Any, *, path: Path, row: int) -> GuiTask:
    """One raw WebGym row as a task; :class:`TaskRowError` naming the field if it is not one."""
    if not isinstance(raw, dict):
        raise TaskRowError(path, row, "(row)", f"must be an object, not {type(raw).__name__}")
    try:
        model = WebGymRow.model_validate(raw)
    except ValidationError as exc:
        first = exc.errors()[0]
        more = f" (and {exc.error_count() - 1} more)" if exc.error_count() > 1 else ""
        message = first["msg"]
        where = _field(dict(first))
        if where == "(row)" and ": " in message:  # a model validator names its field itself
            where, _, message = message.removeprefix("Value error, ").partition(": ")
        raise TaskRowError(path, row, where, message + more) from None
    try:
        facts = _facts(model.evaluator_reference)
    except ValueError as exc:
        raise TaskRowError(path, row, "evaluator_reference", str(exc)) from None
    known = set(WebGymRow.model_fields)
    return GuiTask(
        id=model.task_id, kind="web", instruction=model.task_name.strip(),
        website=model.website, domain=model.domain, subdomain=model.subdomain,
        difficulty=model.difficulty, facts=facts, reference_answer=model.reference_answer,
        parent_id=model.parent_task_id, source=model.source,
        extra={k: v for k, v in raw.items() if k not in known and k != "task"},
    )  # fmt: skip


def iter_tasks(path: str | Path) -> Iterator[GuiTask]:
    """The tasks of a WebGym-style file, validated row by row (ids unique)."""
    path = Path(path)
    seen: dict[str, int] = {}
    for number, raw in read_rows(path):
        task = parse_row(raw, path=path, row=number)
        if task.id in seen:
            raise TaskRowError(path, number, "task_id", f"{task.id!r} repeats row {seen[task.id]}")
        seen[task.id] = number
        yield task


def load_tasks(path: str | Path) -> list[GuiTask]:
    """:func:`iter_tasks` as a list."""
    return list(iter_tasks(path))


MINIWOB_NAME = re.compile(r"^[a-z0-9][a-z0-9-]{0,80}$")


def miniwob_task(name: str, *, instruction: str = "") -> GuiTask:
    """A MiniWoB++ task as a row: ``id`` ``miniwob/<name>``; its instruction is the
    environment's utterance at reset (``instruction`` when known beforehand)."""
    if not MINIWOB_NAME.match(name):
        raise ValueError(f"not a MiniWoB task name: {name!r}")
    return GuiTask(
        id=f"miniwob/{name}", kind="miniwob", instruction=instruction, website=f"miniwob://{name}",
        domain="miniwob", source="miniwob", miniwob=name,
    )  # fmt: skip
