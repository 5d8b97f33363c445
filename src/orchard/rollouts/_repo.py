"""The task repository's final diff, read in the sandbox with git itself.

``git diff`` of the working tree against the commit the task started from (recorded after
``setup``), untracked files included (``.gitignore`` and ``.git/info/exclude`` respected), binary
files as git's binary patches: ``git apply`` replays it exactly. The real index is never
touched: the untracked files are added to a throwaway copy of it (``GIT_INDEX_FILE``), so the
agent's own staging, and the repository the grader sees, are as the agent left them.

The diff is written to a file in the sandbox and read back as a file (not through a command's
output, which the executor caps), so a large diff arrives whole or, over ``max_bytes``, not at
all with an error that says so.
"""

from __future__ import annotations

import contextlib
import uuid

from orchard import AsyncSandbox, OrchardError

EMPTY_TREE = "4b825dc642cb6eb9a060e54bf8d69288fbee4904"
"""git's empty tree: the base of a repository that had no commit when the agent started."""

# -c options that make the patch the same whatever the sandbox's git config says
_GIT = (
    "git -c core.quotepath=off -c diff.noprefix=false -c diff.mnemonicPrefix=false"
    " -c diff.relative=false -c diff.external= -c safe.directory='*'"
)

_DIFF_SCRIPT = """
set -eu
cd "$1"
idx=$(mktemp)
trap 'rm -f "$idx"' EXIT
real=$({git} rev-parse --git-path index)
if [ -f "$real" ]; then cp "$real" "$idx"; else rm -f "$idx"; fi
GIT_INDEX_FILE=$idx {git} add -A
GIT_INDEX_FILE=$idx {git} diff --cached --binary --no-color --no-ext-diff --no-renames \\
    --src-prefix=a/ --dst-prefix=b/ "$2" > "$3"
""".replace("{git}", _GIT)


class DiffError(Exception):
    """The diff could not be taken (not a repository any more, git failed, too large)."""


async def base_commit(sandbox: AsyncSandbox, workdir: str, seconds: float) -> str | None:
    """The commit ``workdir`` is at (the empty tree for a repository with none); None when
    ``workdir`` is not inside a git work tree."""
    inside = await sandbox.exec(
        ["sh", "-c", f"{_GIT} rev-parse --is-inside-work-tree"], cwd=workdir, timeout=seconds
    )
    if inside.exit_code != 0 or inside.stdout.strip() != b"true":
        return None
    head = await sandbox.exec(
        ["sh", "-c", f"{_GIT} rev-parse --verify -q HEAD"], cwd=workdir, timeout=seconds
    )
    return head.stdout_text.strip() if head.exit_code == 0 else EMPTY_TREE


async def final_diff(
    sandbox: AsyncSandbox, workdir: str, base: str, seconds: float, max_bytes: int
) -> str:
    """The diff of ``workdir``'s tree (tracked and untracked) against ``base``, decoded as
    UTF-8 with ``surrogateescape`` (``diff.encode("utf-8", "surrogateescape")`` is the exact
    bytes git wrote, also for a file that is not UTF-8)."""
    out = f"/tmp/.orchard-rollout-{uuid.uuid4().hex}.diff"
    try:
        done = await sandbox.exec(
            ["sh", "-c", _DIFF_SCRIPT, "diff", workdir, base, out], timeout=seconds
        )
        if done.exit_code != 0:
            raise DiffError(
                f"git diff in {workdir} exited {done.exit_code}: {done.stderr_text[-2000:].strip()}"
            )
        size = (await sandbox.stat(out)).size
        if size > max_bytes:
            raise DiffError(f"the diff is {size} bytes, over the {max_bytes}-byte cap")
        return (await sandbox.read_file(out)).decode("utf-8", errors="surrogateescape")
    finally:
        with contextlib.suppress(OrchardError):
            await sandbox.exec(["rm", "-f", out], timeout=seconds)
