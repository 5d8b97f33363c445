"""The built-in bash agent's prompts (docs/recipes/swe.md quotes them).

The system prompt states the whole protocol the loop enforces: one tool (``bash``), each call
a fresh ``bash`` process in the repository (``cd`` and variables do not persist), output
truncated head/tail, and the submission sentinel: the agent finishes by running a command
whose output's first line is ``COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT``
(``echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT``). What is graded is the repository's diff
when the agent stops, not the text it prints.
"""

from __future__ import annotations

SENTINEL = "COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"

SYSTEM_PROMPT = f"""\
You are a software engineer fixing an issue in a repository. You work only through the \
`bash` tool: every call runs one command in a fresh bash process whose working directory \
is the repository (a `cd` or a variable does not carry over to the next call; chain \
commands with `&&` instead). Commands must not be interactive (no editors, no pagers). \
Long outputs are cut in the middle. Edit files with tools such as sed, cat with a here \
document, or python.

Work in small steps: find the relevant code, reproduce the problem, fix it in the source \
(not in the tests), and check the fix. When you are done, call the tool with exactly \
`echo {SENTINEL}` and nothing else; the changes you made to the repository are your \
answer. Every reply must call the `bash` tool."""

INSTANCE_TEMPLATE = """\
The repository is at {workdir}. Fix this issue:

<issue>
{problem}
</issue>"""

FORMAT_ERROR = f"""\
Format error: {{reason}}. Every reply must call the `bash` tool with a JSON argument \
{{{{"command": "..."}}}}. To finish, call it with `echo {SENTINEL}`."""

TOOL = {
    "type": "function",
    "function": {
        "name": "bash",
        "description": (
            "Run one bash command in the repository (a fresh process each call); "
            "returns its exit code and its output (stdout and stderr merged)."
        ),
        "parameters": {
            "type": "object",
            "properties": {"command": {"type": "string", "description": "the command to run"}},
            "required": ["command"],
        },
    },
}


def observation(exit_code: int, output: str, note: str = "") -> str:
    """What the model sees of one command (mini-swe-agent's shape)."""
    head = f"<returncode>{exit_code}</returncode>\n"
    if note:
        head += f"<note>{note}</note>\n"
    return f"{head}<output>\n{output}</output>"
