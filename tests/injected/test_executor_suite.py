"""The executor test suite (tests/executor/) against injected executors, on both images.

The test functions are the executor suite's own, imported unchanged; only the
fixtures differ (tests/injected/conftest.py): ``client`` reaches the executor
running *inside* a real runc sandbox, started from the read-only bundle, on
the busybox-only image (no libc, no Python, no bash) and on the Debian image.
Pid checks are translated from the sandbox's pid namespace to the host.

Left out, with their injected counterparts in test_injected_runtime.py: tests
that use host-side paths or a host-run orchard-init (start failures on a file
under the sandbox's host folder, a dead init, a token for a sandbox the same
executor serves). Sessions need bash: test_sessions_injected.py.
"""

from __future__ import annotations

from collections.abc import Iterator

import grpc
import pytest

from tests.executor import test_auth, test_exec_basic, test_exec_processes
from tests.executor.harness import Client, error_reason

from .conftest import InjectedNode
from .sandbox_pids import SandboxPids

pytestmark = pytest.mark.runc

SUITE_ID = "sb-exec-test"


@pytest.fixture(autouse=True)
def pids_in_the_sandbox(
    node: InjectedNode, client: Client, monkeypatch: pytest.MonkeyPatch
) -> Iterator[None]:
    pids = SandboxPids(node.init_pid(SUITE_ID))
    monkeypatch.setattr(test_exec_processes, "pid_alive", pids.alive)
    monkeypatch.setattr(test_exec_processes, "wait_gone", pids.wait_gone)
    monkeypatch.setattr(test_exec_processes, "kill_pids", pids.kill)
    yield


test_true_and_exit_codes = test_exec_basic.test_true_and_exit_codes
test_killed_by_signal = test_exec_basic.test_killed_by_signal
test_binary_and_invalid_utf8_are_byte_exact = (
    test_exec_basic.test_binary_and_invalid_utf8_are_byte_exact
)
test_cwd_env_and_shell = test_exec_basic.test_cwd_env_and_shell
test_users_are_resolved_in_the_sandbox = test_exec_basic.test_users_are_resolved_in_the_sandbox
test_invalid_requests = test_exec_basic.test_invalid_requests
test_output_cap_truncates_but_the_command_finishes = (
    test_exec_basic.test_output_cap_truncates_but_the_command_finishes
)

test_timeout_kills_the_whole_tree_even_setsid_double_forks = (
    test_exec_processes.test_timeout_kills_the_whole_tree_even_setsid_double_forks
)
test_background_job_does_not_hang_the_exec = (
    test_exec_processes.test_background_job_does_not_hang_the_exec
)
test_exec_streams_stdin_in_and_output_out = (
    test_exec_processes.test_exec_streams_stdin_in_and_output_out
)
test_exec_streams_50_mb_exactly = test_exec_processes.test_exec_streams_50_mb_exactly
test_exec_signal_and_client_cancel_kill = (
    test_exec_processes.test_exec_signal_and_client_cancel_kill
)
test_64_concurrent_execs = test_exec_processes.test_64_concurrent_execs
test_deadline_exceeded_kills_the_command = (
    test_exec_processes.test_deadline_exceeded_kills_the_command
)

test_session_calls_check_tokens = test_auth.test_session_calls_check_tokens


def test_unknown_and_invalid_sandboxes(client: Client) -> None:
    """The node executor answers NOT_FOUND for an unknown sandbox; an injected one holds
    only its own sandbox's token keys, so another sandbox's token cannot even be
    verified there: UNAUTHENTICATED before any lookup (issue 12, per-sandbox keys)."""
    with pytest.raises(grpc.RpcError) as err:
        test_auth._run(client, "sb-does-not-exist", client.metadata("sb-does-not-exist"))
    assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert error_reason(err.value) == "TOKEN_INVALID"
    with pytest.raises(grpc.RpcError) as err:
        test_auth._run(client, "../etc", client.metadata("../etc"))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
