"""Background processes and terminals in injected sandboxes: the executor inside the
sandbox (from the bundle) runs the same background.py and the bundle's orchard-init
(built from the same source) allocates the terminal. One ``orchard up`` with
``ORCHARD_EXECUTOR_BUNDLE`` set, as in test_injected_stack.py."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from orchard import ExecStatus, Orchard, OutputChunk
from tests.stack import REQUIRES_STACK, Stack, running_stack

pytestmark = [*REQUIRES_STACK, pytest.mark.timeout(240)]


@pytest.fixture(scope="module")
def stack(bundle: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    home = tmp_path_factory.mktemp("inj-procs")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("ORCHARD_EXECUTOR_BUNDLE", str(bundle))
        with running_stack(home) as running:
            yield running


def test_processes_and_a_terminal_through_the_sandbox_s_own_executor(stack: Stack) -> None:
    key = (stack.home / "dev-api-key").read_text().strip()
    with Orchard(stack.endpoint, key).sandboxes.create(memory="256Mi", ttl=300) as sb:
        _stub, access = sb._executor()
        assert access.address.endswith(f"/sandboxes/{sb.id}/run/executor.sock")
        proc = sb.start("echo hi; read x; echo got:$x", stdin=True)
        again = Orchard(stack.endpoint, key).sandboxes.connect(sb.id)
        assert [p.id for p in again.processes()] == [proc.id]
        again.process(proc.id).write("y\n")
        assert proc.wait(timeout=30).stdout == b"hi\ngot:y\n"
        term = sb.terminal(["sh", "-c", "tty; stty size; read x; stty size"], rows=11, cols=44)
        seen = b""
        for event in term.output():
            assert not isinstance(event, ExecStatus), seen
            if isinstance(event, OutputChunk):
                seen += event.data
                if b"11 44" in seen:
                    break
        assert b"/dev/pts/" in seen
        term.resize(12, 45)
        term.write("\r")
        assert b"12 45" in term.wait(timeout=30).stdout
