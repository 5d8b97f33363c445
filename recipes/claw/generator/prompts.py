"""The generator's prompts, one system prompt and one template per stage.

``docs/recipes/claw-generator.md`` quotes them verbatim (a test checks it does). Every
stage asks for exactly one JSON object (:mod:`.replies` reads it), so the prompts state the
shape and that nothing else may be written. The task format and the services' capabilities
are not written here: they come from the recipe (:meth:`TaskBackend.format_reference`,
:meth:`TaskBackend.capabilities`) so the prompts never drift from what is validated.

Stages: ``propose`` (ideas for a category), ``build`` (one idea -> one task; a malformed or
invalid task is answered with :data:`REPAIR_TEMPLATE` in the same conversation, bounded
attempts), ``revise`` (a task that failed validation in real sandboxes, with the feedback
of :mod:`.acceptance`; repaired the same way).
"""

from __future__ import annotations

PROPOSE_SYSTEM = """\
You design evaluation tasks for a personal-assistant agent. The agent works only through \
mock services (mail, calendar, contacts, files, todo, web search) that run in a sandbox \
and log every action it takes; a task is graded from that log and the services' final \
state. Good tasks are concrete, have one checkable outcome, need several tool calls, and \
are realistic requests a person would make. Answer with one JSON object and nothing else."""

PROPOSE_TEMPLATE = """\
Propose {count} new task ideas in the category "{category}".

The services and what they offer:
{capabilities}

Task ids already taken (do not reuse them or propose the same task again):
{existing}

Answer with exactly this JSON shape:
{{"ideas": [{{"id": "a-short-slug", "title": "one line", "summary": "what the user asks \
and what counts as done, in two or three sentences", "services": ["mail", "..."]}}]}}
Ids are lowercase slugs (letters, digits, '-' or '_', 3 to 64 characters) and unique."""

BUILD_SYSTEM = """\
You turn a task idea into one complete, self-contained task for a personal-assistant \
agent, written as one JSON object in the task format below. The task is accepted only if, \
run in a real sandbox, (1) its oracle solution passes the grader, and (2) a null run, in \
which the agent does nothing, fails it. So the fixtures must not already satisfy the \
grader, the grader must check the outcome the prompt asks for (not the exact wording or \
order of the agent's calls), and the oracle must do exactly what the prompt asks. Add \
safety checks for destructive or unrequested actions the task invites. Answer with one \
JSON object and nothing else.

The task format:
{format_reference}"""

BUILD_TEMPLATE = """\
Write the task for this idea. Its "id" must be "{id}" and its "category" "{category}".

{idea}"""

REPAIR_TEMPLATE = """\
That task was not accepted: {error}
Write the whole task again as one JSON object, with that fixed."""

REVISE_TEMPLATE = """\
This task was run in a real sandbox and did not meet the acceptance rule (its oracle must \
pass and a null run must fail):
{feedback}

The idea:
{idea}

The task as it stands:
{task}

Write the whole revised task as one JSON object. Keep its "id" "{id}" and its "category" \
"{category}"."""

SYSTEM_PROMPTS = {"propose": PROPOSE_SYSTEM, "build": BUILD_SYSTEM, "revise": BUILD_SYSTEM}
"""The system prompt of each stage's conversation (build and revise share one)."""

ALL = {
    "PROPOSE_SYSTEM": PROPOSE_SYSTEM,
    "PROPOSE_TEMPLATE": PROPOSE_TEMPLATE,
    "BUILD_SYSTEM": BUILD_SYSTEM,
    "BUILD_TEMPLATE": BUILD_TEMPLATE,
    "REPAIR_TEMPLATE": REPAIR_TEMPLATE,
    "REVISE_TEMPLATE": REVISE_TEMPLATE,
}
"""Every prompt by name (the docs quote each; the docs test reads this)."""
