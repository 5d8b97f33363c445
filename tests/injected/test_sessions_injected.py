"""Persistent sessions against an injected executor: the executor suite's own tests.

Sessions need bash, so this module runs on the Debian image only; the
busybox-only image (no bash; busybox ash is not used for sessions) is covered
by test_sessions_busybox.py.
"""

from __future__ import annotations

import pytest

from tests.executor import test_sessions

pytestmark = pytest.mark.runc

shell = test_sessions.shell


@pytest.fixture(scope="module")
def image() -> str:
    return "debian"


test_state_persists_between_commands = test_sessions.test_state_persists_between_commands
test_exit_codes_and_exact_output = test_sessions.test_exit_codes_and_exact_output
test_interrupt_stops_the_command_not_the_session = (
    test_sessions.test_interrupt_stops_the_command_not_the_session
)
test_busy_session_refuses_a_second_command = (
    test_sessions.test_busy_session_refuses_a_second_command
)
test_timeout_interrupts_and_the_session_survives = (
    test_sessions.test_timeout_interrupts_and_the_session_survives
)
test_timeout_kills_a_session_that_ignores_sigint = (
    test_sessions.test_timeout_kills_a_session_that_ignores_sigint
)
test_exit_ends_the_session_clearly = test_sessions.test_exit_ends_the_session_clearly
test_closed_and_unknown_sessions = test_sessions.test_closed_and_unknown_sessions
