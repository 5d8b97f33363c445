"""Sessions on the busybox-only image: it has no bash, so CreateSession fails clearly.

FAILED_PRECONDITION / EXECUTABLE_NOT_FOUND with a message that says sessions
need bash (busybox ash is not used for sessions: the session loop relies on
bash's ``declare``, ``continue N`` across eval and its fd handling).
"""

from __future__ import annotations

import grpc
import pytest

from orchard._proto.orchard.v1 import executor_pb2 as pb
from tests.executor.harness import Client, error_reason

pytestmark = pytest.mark.runc

SUITE_ID = "sb-exec-test"


@pytest.fixture(scope="module")
def image() -> str:
    return "busybox"


def test_busybox_sessions_fail_clearly_without_bash(client: Client) -> None:
    assert client.run(SUITE_ID, argv=["sh", "-c", "command -v bash || echo none"]).stdout == (
        b"none\n"
    )
    with pytest.raises(grpc.RpcError) as err:
        client.stub.CreateSession(
            pb.CreateSessionRequest(sandbox_id=SUITE_ID), metadata=client.metadata(SUITE_ID)
        )
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert error_reason(err.value) == "EXECUTABLE_NOT_FOUND"
    assert "no bash" in (err.value.details() or "")
