"""The run's own witness: a small program that wraps the eval script and binds its output to a nonce.

The candidate's code runs as root inside the sandbox, in the same process tree
as the test runner, so anything the test process can see it can see. The
witness therefore keeps its secret where the candidate cannot look:

- it runs as ``python3 -I -S`` (no site, no ``PYTHONPATH``, no user site: none
  of the repository's code is imported into it) and makes itself
  non-dumpable (``prctl(PR_SET_DUMPABLE, 0)``) before anything else, so its
  memory, environment and file descriptors under ``/proc/<pid>`` are closed to
  the candidate (root in the sandbox holds no ``CAP_SYS_PTRACE``);
- it draws the nonce itself, after that, from ``os.urandom``: the nonce never
  enters the sandbox over stdin, argv, the environment or a file, and is in no
  process the candidate can read;
- it prints a commitment (``sha256(nonce)``) as the first line, runs the eval
  script as a child (stdin ``/dev/null``, stderr merged), waits for it, kills
  every process left in the sandbox but the executor's own (so no detached
  child of the run can write after it; only where pid 1 is Orchard's init
  ``/.orchard/init``, i.e. inside a local-runtime sandbox: never on a host or
  in a pod whose pid 1 is someone else's), then reveals the nonce on the last
  line with the eval script's exit code and the digest of the structured test
  report. A line that imitates the witness, a second begin or end, text after
  the end, or an end whose nonce does not match the commitment is a forgery.

The executor's exec status is the second, independent record: the witness
exits 0 only when it finished its job; a killed or failed witness is an
incomplete run.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass

WITNESS_PREFIX = ">>>>> Orchard Witness"
WITNESS_EXIT_FAILED = 96
"""The witness's own exit code when it could not do its job (no prctl, no fork)."""

WITNESS_SOURCE = r"""
import ctypes, hashlib, os, sys
P = ">>>>> Orchard Witness"
def say(text):
    data = (text + "\n").encode()
    while data:
        data = data[os.write(1, data):]
try:
    if ctypes.CDLL(None).prctl(4, 0, 0, 0, 0) != 0:
        raise OSError("prctl(PR_SET_DUMPABLE, 0) failed")
except Exception as exc:
    say(P + " failed " + type(exc).__name__ + ": " + str(exc))
    sys.exit(96)
nonce = os.urandom(16).hex()
script, report = sys.argv[1], sys.argv[2]
say(P + " begin " + hashlib.sha256(nonce.encode()).hexdigest())
env = dict(os.environ)
if report:
    env["PYTEST_ADDOPTS"] = (env.get("PYTEST_ADDOPTS", "") + " --junitxml=" + report).strip()
pid = os.fork()
if pid == 0:
    null = os.open("/dev/null", os.O_RDONLY)
    os.dup2(null, 0)
    os.dup2(1, 2)
    os.execvpe("bash", ["bash", script], env)
_, status = os.waitpid(pid, 0)
code = os.WEXITSTATUS(status) if os.WIFEXITED(status) else -os.WTERMSIG(status)
mine = set()
p = os.getpid()
while p > 0 and p not in mine:
    mine.add(p)
    try:
        with open("/proc/%d/stat" % p) as f:
            p = int(f.read().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        break
def own(q):
    try:
        return os.readlink("/proc/%d/exe" % q) == "/.orchard/init"
    except OSError:
        return False
for _ in range(50 if own(1) else 0):  # only where pid 1 is Orchard's init: never on a host
    left = [int(d) for d in os.listdir("/proc") if d.isdigit() and int(d) not in mine and not own(int(d))]
    if not left:
        break
    for q in left:
        try:
            os.kill(q, 9)
        except OSError:
            pass
    for q in left:
        try:
            os.waitpid(q, os.WNOHANG)
        except OSError:
            pass
digest = "none"
if report:
    try:
        with open(report, "rb") as f:
            digest = hashlib.sha256(f.read()).hexdigest()
    except OSError:
        pass
say(P + " end " + nonce + " exit=" + str(code) + " report=" + digest)
"""
"""Run as ``python3 -I -S -c WITNESS_SOURCE EVAL_SCRIPT REPORT_PATH`` (REPORT_PATH "" = none)."""

_BEGIN = re.compile(rf"^{re.escape(WITNESS_PREFIX)} begin ([0-9a-f]{{64}})$")
_END = re.compile(
    rf"^{re.escape(WITNESS_PREFIX)} end ([0-9a-f]{{32}}) exit=(-?\d+) report=([0-9a-f]{{64}}|none)$"
)


def witness_command(script_path: str, report_path: str) -> list[str]:
    """The argv of the wrapped run (the nonce is not in it: the witness draws it)."""
    return ["python3", "-I", "-S", "-c", WITNESS_SOURCE, script_path, report_path]


@dataclass(frozen=True)
class WitnessRecord:
    """What the witness vouches for: the eval script's output, its exit code, the report's digest."""

    body: str
    exit_code: int
    report_digest: str | None


class WitnessViolation(Exception):
    """The output does not carry a valid witness record; ``flag`` names how."""

    def __init__(self, flag: str, reason: str) -> None:
        super().__init__(reason)
        self.flag = flag
        self.reason = reason


FORGED_LOG = "forged_log"
RUNNER_INCOMPLETE = "runner_incomplete"


def read_witnessed(output: str, exec_exit_code: int) -> WitnessRecord:
    """Check the witness's lines in ``output`` and return the text they enclose.

    Raises :class:`WitnessViolation`: ``runner_incomplete`` when the witness did
    not finish (no end line, the exec ended badly), ``forged_log`` when a line
    imitates it or the record does not hold together.
    """
    lines = output.rstrip("\n").split("\n")
    marked = [i for i, line in enumerate(lines) if WITNESS_PREFIX in line]
    if not marked or not _BEGIN.match(lines[marked[0]]):
        failed = [lines[i] for i in marked if " failed " in lines[i]]
        raise WitnessViolation(
            RUNNER_INCOMPLETE, failed[0] if failed else "the witness never started the run"
        )
    if marked[0] != 0:
        raise WitnessViolation(FORGED_LOG, "text before the witness's first line")
    end = _END.match(lines[-1])
    if end is None and len(marked) == 2 and _END.match(lines[marked[1]]):
        raise WitnessViolation(FORGED_LOG, "text after the witness's end line")
    if end is None:
        if len(marked) > 1:
            raise WitnessViolation(FORGED_LOG, "a line imitates the witness (no valid end line)")
        raise WitnessViolation(
            RUNNER_INCOMPLETE,
            f"the witness did not finish (exec exit code {exec_exit_code}): the run was cut short",
        )
    if len(marked) != 2:
        raise WitnessViolation(
            FORGED_LOG, f"{len(marked) - 2} line(s) in the test output imitate the witness"
        )
    commitment = _BEGIN.match(lines[0])
    assert commitment is not None
    nonce, code, digest = end.groups()
    if hashlib.sha256(nonce.encode()).hexdigest() != commitment.group(1):
        raise WitnessViolation(FORGED_LOG, "the witness's end line does not match its commitment")
    if exec_exit_code != 0:
        raise WitnessViolation(
            RUNNER_INCOMPLETE, f"the witness exited {exec_exit_code} after its end line"
        )
    return WitnessRecord(
        "\n".join(lines[1:-1]) + "\n", int(code), None if digest == "none" else digest
    )
