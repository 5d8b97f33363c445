"""The Claw task generator: propose -> build -> validate in sandboxes -> revise -> solve.

A model proposes task ideas for a category, writes each as a task of the recipe's format
(fixtures, prompt, grader spec, oracle), and the task is run in real sandboxes: it is kept
only if its oracle run passes and a null run fails; a failed validation is fed back to the
model for a bounded number of revisions; a kept task is attempted by a model through the
ReAct loop (its score tells how hard it is). Every generation call goes through the
recording proxy, so what each kept task cost (tokens per stage, model calls, wall and
sandbox time) is written with it. See ``docs/recipes/claw-generator.md``.

Modules: :mod:`.replies` (reading a hostile reply), :mod:`.ideas`, :mod:`.prompts`,
:mod:`.model` (proxy sessions and their usage), :mod:`.backend` (what the generator needs
of the recipe), :mod:`.acceptance` (the rule and the feedback), :mod:`.stages`,
:mod:`.loop`, :mod:`.costs`, :mod:`.manifest`, :mod:`.policy` (a generated task's limits),
:mod:`.taskformat` and :mod:`.claw` (the recipe's backend) and :mod:`.cli`
(``python -m orchard.recipes.claw.generator``).
"""

from .acceptance import Verdict, judge
from .backend import InvalidTask, TaskBackend, Trial
from .ideas import Idea, RejectedIdea
from .loop import GeneratorOptions, Outcome, Report, develop, generate
from .model import Conversation, GenerationModel, GenerationModelError, Usage

__all__ = [
    "Conversation",
    "GenerationModel",
    "GenerationModelError",
    "GeneratorOptions",
    "Idea",
    "InvalidTask",
    "Outcome",
    "RejectedIdea",
    "Report",
    "TaskBackend",
    "Trial",
    "Usage",
    "Verdict",
    "develop",
    "generate",
    "judge",
]
