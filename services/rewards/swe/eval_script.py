"""The bash script that runs an instance's tests inside the sandbox.

It changes to the work directory, runs the pre-commands, echoes the start
marker, runs the test command with stderr merged into stdout, records its exit
code after the end marker (``>>>>> Test Exit Code: N``, as swebench 5.x's eval
scripts do, so grading can reject a log that claims success for a failed run).
The reward runner runs it under the witness (``witness``).
"""

from __future__ import annotations

import shlex

from .grading import END_MARKER, EXIT_CODE_MARKER, START_MARKER
from .instance import SweInstance

EXIT_CODE_VAR = "ORCHARD_TEST_EXIT_CODE"


def eval_script(instance: SweInstance, *, exit_with_test_code: bool = False) -> str:
    """The script; ``exit_with_test_code`` makes it exit with the tests' code (the witness
    records it, bound to its nonce), where the plain script exits 0 as swebench's do."""
    lines = [
        "#!/bin/bash",
        "set -uo pipefail",
        f"cd {shlex.quote(instance.workdir)} || exit 97",
        *instance.pre_commands,
        f"echo {shlex.quote(START_MARKER)}",
        f"{{ {instance.test_cmd} ; }} 2>&1",
        f"{EXIT_CODE_VAR}=$?",
        f"echo {shlex.quote(END_MARKER)}",
        f'echo "{EXIT_CODE_MARKER}: ${EXIT_CODE_VAR}"',
        f"exit ${EXIT_CODE_VAR}" if exit_with_test_code else "exit 0",
    ]
    return "\n".join(lines) + "\n"


APPLY_COMMANDS: tuple[tuple[str, str], ...] = (
    ("git apply", "git apply -v {patch}"),
    ("git apply --reject", "git apply -v --reject {patch}"),
    ("patch --fuzz", "patch --batch --fuzz=5 -p1 -i {patch}"),
)
"""The cascade, in order; the first that exits 0 wins (the original's, and swebench's harness's)."""
